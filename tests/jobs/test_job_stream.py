"""A tenant follows a job live: `GET /v1/jobs/{id}/stream` (Server-Sent Events).

Served as `make up` serves it (gunicorn with uvicorn workers, config.asgi) on the test
database, with real GPU-pool workers running the stand-in: the stream sees queued →
running → succeeded, progress in between at most twice a second, and closes.
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from urllib.parse import urlsplit

import pytest

from apps.jobs import queue_state
from apps.jobs.models import Job, JobStatus
from apps.jobs.queue_state import QueueState
from apps.jobs.services.cancel import cancel_job
from tests.factories import OrgFactory, ProjectFactory, org_key
from tests.jobs.factories import funded_org, spec_body
from tests.ledger.assertions import assert_ledger_exact
from tests.worker_harness import ApiServer, Beat, pool_fixture

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

workers = pool_fixture("e2e-h100")


@pytest.fixture
def beat(workers, settings):
    beat = Beat.over(workers, settings)
    yield beat
    beat.drain(timeout=15, dispatch=True)


@pytest.fixture
def api(workers):
    server = ApiServer.launch(workers)
    yield server
    server.stop(grace=5)


class Stream:
    """Reads one SSE stream in a thread: the events (with the time each arrived)."""

    def __init__(self, url: str, path: str, key: str):
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        self.response = self.conn.getresponse()
        self.events: list[tuple[float, dict]] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        kind, data = None, []
        try:
            for raw in self.response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    kind = line[len("event: ") :]
                elif line.startswith("data: "):
                    data.append(line[len("data: ") :])
                elif line == "" and kind:
                    self.events.append((time.monotonic(), json.loads("".join(data))))
                    kind, data = None, []
        finally:
            self.closed.set()

    def statuses(self) -> list[str]:
        seen = []
        for _, body in self.events:
            if not seen or seen[-1] != body["status"]:
                seen.append(body["status"])
        return seen


def submit_http(api, key: str, **spec) -> dict:
    parts = urlsplit(api.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = json.dumps(spec_body(project="video", **spec))
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/json",
        "Idempotency-Key": f"k-{time.monotonic_ns()}",
    }
    conn.request("POST", "/v1/jobs", body, headers)
    response = conn.getresponse()
    assert response.status == 202, response.read()
    return json.loads(response.read())


def test_a_stream_sees_queued_running_succeeded_then_closes(api, beat):
    org = funded_org()
    ProjectFactory(org=org, name="video")
    key = org_key(org)
    job = submit_http(
        api, key, params={"prompt": "fox", "steps": 12, "step_seconds": 0.25}, preemptible=True
    )
    stream = Stream(api.url, f"/v1/jobs/{job['id']}/stream", key)
    assert stream.response.status == 200
    assert stream.response.getheader("Content-Type").startswith("text/event-stream")

    beat.until(lambda: Job.objects.get(pk=job["id"]).is_terminal, timeout=60)
    assert stream.closed.wait(20), "the stream stays open after the job ended"

    assert stream.statuses()[0] == "queued"
    assert stream.statuses()[-1] == "succeeded"
    assert "running" in stream.statuses()
    first_queued = stream.events[0][1]
    assert first_queued["queue"] is not None and "position" in first_queued["queue"]
    values = [body["progress"] for _, body in stream.events if body["status"] == "running"]
    assert values == sorted(values) and len(set(values)) >= 2, values
    for (t1, before), (t2, after) in itertools.pairwise(stream.events):
        if before["status"] == after["status"]:  # an update within a status
            assert t2 - t1 >= 0.4, "updates come at most twice a second"
    assert stream.events[-1][1]["hold"]["state"] == "settled"
    assert_ledger_exact(Job.objects.get(pk=job["id"]))


def test_a_stream_of_a_cancelled_queued_job_ends_with_cancelled(api, beat):
    org = funded_org()
    ProjectFactory(org=org, name="video")
    key = org_key(org)
    job = submit_http(api, key)  # nobody ticks the dispatcher: it stays queued
    stream = Stream(api.url, f"/v1/jobs/{job['id']}/stream", key)
    time.sleep(0.3)
    cancel_job(job["id"], actor="test", reason="changed my mind")
    assert stream.closed.wait(20)
    assert stream.statuses() == ["queued", "cancelled"]
    assert stream.events[-1][1]["hold"]["state"] == "released"


def test_another_orgs_stream_is_404_and_no_key_is_401(api, beat):
    org = funded_org()
    ProjectFactory(org=org, name="video")
    job = submit_http(api, org_key(org))
    parts = urlsplit(api.url)
    for headers, status in (
        ({"Authorization": f"Bearer {org_key(OrgFactory())}"}, 404),
        ({}, 401),
        ({"Authorization": "Bearer gk_nonsense"}, 401),
    ):
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", f"/v1/jobs/{job['id']}/stream", headers=headers)
        response = conn.getresponse()
        assert response.status == status
        assert json.loads(response.read())["error"]["code"] in ("not_found", "unauthenticated")
    cancel_job(job["id"], actor="test", reason="cleanup")
    assert Job.objects.get(pk=job["id"]).status == JobStatus.CANCELLED


def test_a_queued_jobs_stream_carries_its_position_as_the_dispatcher_publishes_it(api, beat):
    org = funded_org()
    ProjectFactory(org=org, name="video")
    key = org_key(org)
    job = submit_http(api, key)  # nobody ticks the dispatcher: it stays queued
    stream = Stream(api.url, f"/v1/jobs/{job['id']}/stream", key)
    time.sleep(0.3)
    reason = "waiting for an H100: 2 of 2 busy"
    state = QueueState(position=3, reason=reason, estimated_start_at=None)
    queue_state.publish([(job["id"], state)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        (body["queue"] or {}).get("position") == 3 for _, body in stream.events
    ):
        time.sleep(0.1)
    updated = [body for _, body in stream.events if (body["queue"] or {}).get("position") == 3]
    assert updated, [body["queue"] for _, body in stream.events]
    assert updated[0]["queue"]["reason"] == reason
    cancel_job(job["id"], actor="test", reason="cleanup")
    assert stream.closed.wait(20)
