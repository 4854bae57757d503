"""A restart of `make up` keeps every org's webhook secret and every result link valid:
the secret key they derive from is made once and kept (.data/secret_key)."""

from __future__ import annotations

import time
import urllib.request

import pytest

from tests.ops.launched import call, drop_scratch_database, launched_platform
from tests.ops.live_stack import stack_py

pytestmark = pytest.mark.e2e


def test_a_restart_keeps_webhook_secrets_and_result_links_valid(tmp_path):
    port = stack_py.free_port()  # a restart serves where links point
    try:
        with launched_platform(tmp_path / "first", api_port=port) as first:
            op = first.operator_key
            status, org = call(
                f"{first.api}/v1/orgs", key=op, body={"name": "acme", "tier": "paid"}
            )
            assert status == 201, org
            call(f"{first.api}/v1/orgs/{org['id']}/projects", key=op, body={"name": "video"})
            grant = {"org": org["id"], "amount": 100_000_000, "kind": "paid"}
            assert call(f"{first.api}/v1/credits/grants", key=op, body=grant)[0] == 201
            tenant = call(f"{first.api}/v1/api-keys", key=op, body={"org": org["id"]})[1]["key"]
            secret = call(f"{first.api}/v1/webhooks/secret", key=tenant)[1]["secret"]
            body = {
                "project": "video",
                "params": {"prompt": "a fox", "steps": 3, "step_seconds": 0.1},
                "max_runtime_s": 120,
            }
            job = call(f"{first.api}/v1/jobs", key=tenant, body=body)[1]
            deadline = time.monotonic() + 90
            while (job := call(f"{first.api}/v1/jobs/{job['id']}", key=tenant)[1])["status"] != (
                "succeeded"
            ):
                assert time.monotonic() < deadline, job
                time.sleep(0.5)
            link = job["result"]["url"]
        with launched_platform(tmp_path / "second", fresh_database=False, api_port=port) as second:
            assert call(f"{second.api}/v1/webhooks/secret", key=tenant)[1]["secret"] == secret
            with urllib.request.urlopen(link, timeout=10) as answer:  # noqa: S310 (our link)
                assert answer.status == 200 and answer.read()[:3] == b"GIF"
    finally:
        drop_scratch_database()
