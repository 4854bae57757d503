"""The API as gunicorn serves it (config.asgi, the buffered WSGI bridge): bodies of every
shape in, small and large answers out, as clients send and read them."""

from __future__ import annotations

import http.client
import json
import urllib.parse
import uuid
from pathlib import Path

import drf_spectacular_sidecar

from apps.accounts.models import Tier
from tests.ops.live_stack import job_body, make_tenant, on_live_stack


def request(stack, method: str, path: str, *, body=None, headers=None, chunked=False):
    """(status, headers, body) of one request on its own connection."""
    url = urllib.parse.urlsplit(stack.api_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


@on_live_stack
def test_a_static_file_larger_than_the_bridge_buffers_arrives_whole(ops):
    bundle = "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js"
    on_disk = (Path(drf_spectacular_sidecar.__file__).parent / "static" / bundle).read_bytes()
    assert len(on_disk) > 1 << 20  # streamed from the worker thread in pieces
    status, _, body = request(ops, "GET", f"/static/{bundle}")
    assert (status, len(body), body == on_disk) == (200, len(on_disk), True)


def submit_chunked(stack, key: str, pieces) -> tuple[int, dict]:
    """POST /v1/jobs with a body sent in `pieces` (chunked, no Content-Length)."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Idempotency-Key": str(uuid.uuid4()),
    }
    status, _, body = request(stack, "POST", "/v1/jobs", body=pieces, headers=headers, chunked=True)
    return status, json.loads(body)


@on_live_stack
def test_a_submission_sent_chunked_is_admitted_and_one_over_the_limit_is_413(ops):
    tenant = make_tenant(tier=Tier.PAID)
    payload = json.dumps(job_body(tenant, prompt="sent in chunks", steps=2)).encode()
    status, job = submit_chunked(
        ops, tenant.key, (payload[i : i + 50] for i in range(0, len(payload), 50))
    )
    assert status == 202, job
    assert job["params"]["prompt"] == "sent in chunks"
    # 3 MiB, over DATA_UPLOAD_MAX_MEMORY_SIZE
    status, refusal = submit_chunked(ops, tenant.key, (b"x" * (1 << 20) for _ in range(3)))
    assert (status, refusal["error"]["code"]) == (413, "too_large")
