"""A tenant reads what the generator printed: `GET /v1/jobs/{id}/logs`.

Real GPU-pool workers run the stand-in and the API runs as `make up` serves it: a crashed
attempt's log holds its traceback, kept per attempt; a running attempt's lines are
followed live and the follow ends with the attempt; another org gets 404; a runaway
generator's log keeps its first and last part and says what was cut.
"""

from __future__ import annotations

import http.client
import json
import threading
from urllib.parse import urlsplit

import pytest

from apps.jobs.models import Job, JobStatus
from apps.jobs.services.logs import AttemptLog
from tests.factories import OrgFactory, ProjectFactory, org_key
from tests.jobs.factories import funded_org, spec_body
from tests.worker_harness import ApiServer, Beat, pool_fixture


def test_a_long_log_keeps_its_first_and_last_part_and_says_what_was_cut():
    log = AttemptLog(limit_bytes=1000)
    for i in range(1000):
        log.add(f"line {i:04d} " + "x" * 40)
    log.add("Traceback (most recent call last): the end")
    text = log.text()
    assert text.startswith("line 0000 ")
    assert text.rstrip().endswith("Traceback (most recent call last): the end")
    assert "lines (" in text and "bytes) cut" in text
    assert len(text.encode()) < 1000 + 200
    assert len(log.take_pending()) == 1001  # every line still went out live


def test_one_endless_line_is_cut_too():
    log = AttemptLog(limit_bytes=1000)
    log.add("y" * 100_000)
    assert len(log.text()) < 20_000 and "characters cut" in log.text()


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


def request(api, path: str, key: str, *, method="GET", body=None, headers=None):
    parts = urlsplit(api.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    all_headers = {"Authorization": f"Bearer {key}", **(headers or {})}
    if body is not None:
        all_headers.update({"Content-Type": "application/json", "Idempotency-Key": path + key})
    conn.request(method, path, json.dumps(body) if body is not None else None, all_headers)
    return conn.getresponse()


def submit(api, key: str, **spec) -> str:
    response = request(api, "/v1/jobs", key, method="POST", body=spec_body(project="video", **spec))
    assert response.status == 202, response.read()
    return json.loads(response.read())["id"]


def tenant():
    org = funded_org()
    ProjectFactory(org=org, name="video")
    return org, org_key(org)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_crashed_attempts_log_holds_its_traceback_and_another_org_gets_404(api, beat):
    _, key = tenant()
    job_id = submit(api, key, params={"prompt": "!crash now", "steps": 4, "step_seconds": 0.05})
    beat.until(lambda: Job.objects.get(pk=job_id).is_terminal, timeout=60)
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.FAILED and job.attempt_count >= 2

    first = request(api, f"/v1/jobs/{job_id}/logs?attempt=1", key)
    assert first.status == 200
    assert first.getheader("Content-Type").startswith("text/plain")
    text = first.read().decode()
    assert "Traceback (most recent call last)" in text
    assert "PROGRESS" in text  # stdout and stderr, in one log
    latest = request(api, f"/v1/jobs/{job_id}/logs", key).read().decode()
    assert "Traceback" in latest

    assert request(api, f"/v1/jobs/{job_id}/logs", org_key(OrgFactory())).status == 404
    assert request(api, f"/v1/jobs/{job_id}/logs?attempt=99", key).status == 404
    refused = request(api, f"/v1/jobs/{job_id}/logs?attempt=x", key)
    assert refused.status == 400
    assert json.loads(refused.read())["error"]["field"] == "attempt"


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_running_attempts_lines_are_followed_live_until_it_ends(api, beat):
    _, key = tenant()
    job_id = submit(api, key, params={"prompt": "fox", "steps": 20, "step_seconds": 0.2})
    beat.until(lambda: Job.objects.get(pk=job_id).status == JobStatus.RUNNING, timeout=30)
    response = request(api, f"/v1/jobs/{job_id}/logs", key, headers={"Accept": "text/event-stream"})
    assert response.status == 200
    assert response.getheader("Content-Type").startswith("text/event-stream")
    lines, done = [], threading.Event()

    def read():
        for raw in response:
            text = raw.decode().rstrip("\n")
            if text.startswith("data: "):
                lines.append(text[len("data: ") :])
        done.set()

    threading.Thread(target=read, daemon=True).start()
    beat.until(lambda: Job.objects.get(pk=job_id).is_terminal, timeout=60)
    assert done.wait(20), "the follow stays open after the attempt ended"
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED
    progress = [line for line in lines if line.startswith("PROGRESS")]
    assert len(progress) == 20, lines
    stored = request(api, f"/v1/jobs/{job_id}/logs", key).read().decode().splitlines()
    assert [line for line in stored if line.startswith("PROGRESS")] == progress
