"""Structured logs: JSON lines that say which request, job, attempt and org they are about.

The first tests look at the pieces in this process (formatter, context, the message a
published task carries in Redis); the last two read the real worker's log file after
work that came in over the API.
"""

from __future__ import annotations

import io
import json
import logging
import re
import uuid

import pytest
import redis
from django.conf import settings

from apps.accounts.models import Tier
from apps.core.logging import (
    ContextFilter,
    JsonFormatter,
    bind_task,
    job_log_context,
    request_id_var,
    unbind_task,
)
from apps.jobs.models import Attempt, Job, JobStatus
from tests.jobs.factories import JobFactory
from tests.ops.live_stack import job_body, make_tenant, terminal, wait_for


def json_lines(text: str) -> list[dict]:
    """The log lines of a log (Celery's start-up banner, printed, is not one); a log line
    that is not a JSON object fails the test."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.fixture
def captured():
    """A logger writing through the platform's filter and formatter into a buffer."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(f"tests.ops.{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, buffer


@pytest.mark.django_db
def test_lines_inside_a_job_context_name_job_attempt_org_and_its_request(captured):
    logger, buffer = captured
    job = JobFactory()
    token = request_id_var.set("req-outer")
    try:
        with job_log_context(job=job, request_id="req-of-the-job"):
            with job_log_context(attempt_id="attempt-7"):
                logger.info("attempt %d started", 1, extra={"node": "node-1"})
            logger.warning("between attempts")
        logger.info("after the job")
    finally:
        request_id_var.reset(token)

    started, between, after = json_lines(buffer.getvalue())
    assert started["msg"] == "attempt 1 started"
    assert {k: started[k] for k in ("job_id", "attempt_id", "org_id", "request_id", "node")} == {
        "job_id": str(job.pk),
        "attempt_id": "attempt-7",
        "org_id": str(job.org_id),
        "request_id": "req-of-the-job",
        "node": "node-1",
    }
    assert (between["level"], between["job_id"], between["request_id"]) == (
        "WARNING",
        str(job.pk),
        "req-of-the-job",
    )
    assert "attempt_id" not in between
    assert after["request_id"] == "req-outer" and "job_id" not in after


def test_a_task_run_replaces_the_context_of_the_previous_one(captured):
    logger, buffer = captured
    bind_task(name="gantry.jobs.run_attempt", task_id="t-1", request_id="req-1")
    with job_log_context(job_id="job-1"):
        logger.info("first task")
    unbind_task()
    bind_task(name="gantry.jobs.deliver_webhook", task_id="t-2", request_id=None)
    logger.info("second task")
    unbind_task()
    logger.info("no task")

    first, second, idle = json_lines(buffer.getvalue())
    assert (first["task"], first["task_id"], first["request_id"], first["job_id"]) == (
        "gantry.jobs.run_attempt",
        "t-1",
        "req-1",
        "job-1",
    )
    assert (second["task"], second["task_id"]) == ("gantry.jobs.deliver_webhook", "t-2")
    assert "request_id" not in second and "job_id" not in second
    assert not {"task", "task_id", "request_id"} & idle.keys()


def test_a_task_published_during_a_request_carries_its_request_id():
    from config.celery import app

    queue = f"ops.capture.{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    token = request_id_var.set("req-publish-42")
    try:
        app.send_task("gantry.ops.nothing", args=[1], queue=queue)
    finally:
        request_id_var.reset(token)
    app.send_task("gantry.ops.nothing", args=[2], queue=queue)
    try:
        raw = client.lrange(queue, 0, -1)  # kombu's Redis transport: one list per queue
        headers = {json.loads(m)["headers"]["argsrepr"]: json.loads(m)["headers"] for m in raw}
    finally:
        client.delete(queue)
    assert headers["[1]"]["request_id"] == "req-publish-42"
    assert "request_id" not in headers["[2]"]


@pytest.mark.parametrize(
    "sent", ["two words", "line\nbreak", "x" * 65, "", "caf\u00e9"], ids=lambda s: repr(s)[:12]
)
def test_a_request_id_that_is_not_a_plain_token_is_replaced_by_a_minted_one(client, sent):
    answered = client.get("/healthz", HTTP_X_REQUEST_ID=sent)["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", answered)


def test_a_plain_request_id_is_kept(client):
    sent = "client-7.retry:2@edge_1"
    assert client.get("/healthz", HTTP_X_REQUEST_ID=sent)["X-Request-Id"] == sent


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_worker_lines_about_a_job_carry_the_submissions_request_id(ops):
    tenant = make_tenant(tier=Tier.PAID)
    request_id = f"ops-req-{uuid.uuid4().hex[:12]}"
    status, job = ops.submit(
        tenant.key, job_body(tenant, prompt="a lantern in fog"), request_id=request_id
    )
    assert status == 202
    ops.until(terminal(job["id"]))
    assert Job.objects.get(pk=job["id"]).status == JobStatus.SUCCEEDED, ops.logs()
    attempt = Attempt.objects.get(job_id=job["id"])

    def lines_of_job() -> list[dict]:
        return [x for x in json_lines(ops.gpu_worker.log()) if x.get("job_id") == job["id"]]

    # The run's last line is written just after the finish committed.
    wait_for(lambda: any(" ended " in x["msg"] for x in lines_of_job()), what="its last line")
    assert not re.search(r"^\[\d{4}-\d\d-\d\d \d", ops.gpu_worker.log(), re.M), (
        "a line in Celery's own format"
    )
    about_job = lines_of_job()
    assert [
        line["msg"].split()[2] for line in about_job if line["msg"].startswith("attempt 1")
    ] == [
        "started",
        "ended",
    ]
    for line in about_job:
        assert (line["attempt_id"], line["org_id"], line["request_id"]) == (
            str(attempt.pk),
            str(tenant.org.pk),
            request_id,
        ), line
        assert line["task"] == "gantry.jobs.run_attempt"
    # The API's access line for the submission names the same request id.
    assert any(
        f"request_id={request_id}" in line["msg"] and "POST /v1/jobs" in line["msg"]
        for line in json_lines(ops.api.log())
    )


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_request_id_travels_in_the_task_headers_to_the_worker(ops):
    from config.celery import app

    request_id = f"ops-hdr-{uuid.uuid4().hex[:12]}"
    token = request_id_var.set(request_id)
    try:  # a stale run message: the worker refuses to claim it and says so
        result = app.send_task(
            "gantry.jobs.run_attempt",
            args=[str(uuid.uuid4()), 1],
            queue=f"node.{ops.gpu_worker.node}",
        )
    finally:
        request_id_var.reset(token)

    def answered() -> list[dict]:
        return [
            line
            for line in json_lines(ops.gpu_worker.log())
            if line.get("task_id") == result.id and "succeeded" in line["msg"]
        ]

    wait_for(lambda: answered(), what="the worker ran the task", timeout=15)
    (line,) = answered()
    assert "'not claimed'" in line["msg"]
    assert (line["request_id"], line["task"]) == (request_id, "gantry.jobs.run_attempt")
