"""webhook_events: a job hears of its start, its progress (at most once a second) and its
end, as it asked at submission, each delivery signed, the best-effort ones never holding
up the job. Deliveries go to a real local HTTP receiver (tests/jobs/test_webhooks.py);
task messages run inline in this process, except in the last test, where a real Celery
control worker delivers them."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from apps.jobs import tasks
from apps.jobs.models import ExitClass, Job, JobEvent, JobStatus
from apps.jobs.services import attempts, webhooks
from apps.jobs.services.lifecycle import transition
from apps.jobs.services.outcomes import end_job
from apps.jobs.services.webhooks import verify_signature
from apps.ledger.models import Hold
from tests import worker_harness as harness
from tests.jobs.factories import JobFactory, funded_org, place, reset_job_state, spec_body, submit
from tests.jobs.test_webhooks import LOCAL_HOOKS, HookServer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]

EVERY_EVENT = ["start", "progress", "completed"]
TASKS = {
    webhooks.DELIVER_TASK: tasks.deliver_webhook,
    webhooks.EVENT_TASK: tasks.deliver_webhook_event,
}


@dataclass
class InlineBroker:
    """Stands in for the broker: runs each published task here and now (its retries at
    once, as Celery's eager mode does), and remembers what was published."""

    down: bool = False
    published: list = field(default_factory=list)

    def send_task(self, name, args=(), queue=None, **options):
        if self.down:
            raise ConnectionError("broker unreachable")
        self.published.append((name, list(args), options))
        return TASKS[name].apply(args=args)

    def events(self) -> list[str]:
        return [
            "completed" if name == webhooks.DELIVER_TASK else args[1]
            for name, args, _ in self.published
        ]


@pytest.fixture
def broker(monkeypatch):
    inline = InlineBroker()
    monkeypatch.setattr(webhooks, "current_app", inline)
    return inline


@pytest.fixture
def hooks():
    with override_settings(**LOCAL_HOOKS), HookServer() as server:
        yield server


@pytest.fixture
def run(django_capture_on_commit_callbacks):
    """Call a service in its own transaction and run what it queued on commit."""

    def call(function, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return function(*args, **kwargs)

    return call


def scheduled_job(org, *, url: str, events=None):
    job = JobFactory(
        org=org,
        status=JobStatus.SCHEDULED,
        webhook_url=url,
        with_hold=True,
        **({"webhook_events": events} if events is not None else {}),
    )
    return job, place(job)


def succeed(run, attempt):
    finish = attempts.Finish(ExitClass.SUCCEEDED, 0, gpu_ms=1_000, charged=0)
    return run(attempts.finish_attempt, attempt, finish, worker="w1")


def delivered(request: dict, org) -> dict:
    """The body of a delivery whose signature checks out with the org's secret."""
    secret = webhooks.webhook_secret(org.id)
    assert verify_signature(secret, request["body"], request["headers"]["X-Gantry-Signature"])
    return json.loads(request["body"])


# --- the whole life of a job ------------------------------------------------------------


def test_a_job_asking_for_every_event_hears_start_then_progress_at_most_once_a_second_then_end(
    org, hooks, broker, run
):
    job, attempt = scheduled_job(org, url=hooks.url, events=EVERY_EVENT)

    attempt = run(attempts.claim_attempt, attempt.id, attempt.fencing_token, worker="w1")
    # Heartbeats report a rising progress ten times a second for two and a half seconds.
    began = time.monotonic()
    for beat in range(1, 26):
        run(attempts.heartbeat, attempt, gpu_ms=beat * 100, charged=0, seq=beat, progress=beat / 50)
        time.sleep(0.1)
    seconds = time.monotonic() - began
    succeed(run, attempt)

    requests = hooks.requests
    bodies = [delivered(request, org) for request in requests]
    events = [body["event"] for body in bodies]
    assert events[0] == "start" and events[-1] == "completed", events
    assert set(events[1:-1]) == {"progress"}, events
    assert 2 <= len(events[1:-1]) <= int(seconds) + 1, (events, seconds)

    start, *progress, completed = zip(requests, bodies, strict=True)
    assert start[1]["status"] == "running" and start[1]["attempt"] == 1
    assert start[0]["headers"]["X-Gantry-Event"] == "job.start"
    assert start[0]["headers"]["X-Gantry-Delivery"] == f"{job.id}.start.1"

    # Never two progress deliveries within a second (up to the receiver's clock jitter),
    # and each one newer than the last.
    arrivals = [request["at"] for request, _ in progress]
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert min(gaps) >= 0.95, gaps
    values = [body["progress"] for _, body in progress]
    assert values == sorted(set(values)) and values[0] > 0, values
    for request, body in progress:
        assert request["headers"]["X-Gantry-Event"] == "job.progress"
        assert request["headers"]["X-Gantry-Delivery"] == f"{job.id}.progress.{body['progress']}"
    # A burst of heartbeats is not a burst of task messages either (two a second at most).
    assert broker.events().count("progress") <= 2 * seconds + 1, broker.events()

    assert completed[1]["status"] == "succeeded" and completed[1]["finished_at"]
    assert completed[0]["headers"]["X-Gantry-Delivery"] == f"{job.id}.succeeded"
    assert JobEvent.objects.filter(job=job, data__webhook="delivered").count() == 1


def test_by_default_a_job_hears_only_of_its_end(tenant, project, hooks, broker, run):
    response = submit(tenant, spec_body(project="video", webhook_url=hooks.url))
    assert response.status_code == 202, response.content
    assert response.json()["webhook_events"] == ["completed"]
    job = Job.objects.get(pk=response.json()["id"])
    assert job.webhook_events == ["completed"]

    transition(job.id, to=JobStatus.SCHEDULED, reason="placed", actor="test")
    job.refresh_from_db()
    attempt = place(job)
    attempt = run(attempts.claim_attempt, attempt.id, attempt.fencing_token, worker="w1")
    run(attempts.heartbeat, attempt, gpu_ms=100, charged=0, seq=1, progress=0.5)
    succeed(run, attempt)

    assert broker.events() == ["completed"]
    [request] = hooks.requests
    body = delivered(request, job.org)
    assert (body["event"], body["status"], body["webhook_events"]) == (
        "completed",
        "succeeded",
        ["completed"],
    )


def test_a_resumed_attempt_after_a_preemption_announces_its_start_again_with_its_number(
    org, hooks, broker, run
):
    job, first = scheduled_job(org, url=hooks.url, events=["start"])
    first = run(attempts.claim_attempt, first.id, first.fencing_token, worker="w1")
    transition(job.id, to=JobStatus.PREEMPTING, reason="make room", actor="test")
    preempted = attempts.Finish(ExitClass.PREEMPTED, None, gpu_ms=500, charged=0)
    run(attempts.finish_attempt, first, preempted, worker="w1")

    transition(job.id, to=JobStatus.SCHEDULED, reason="placed again", actor="test")
    job.refresh_from_db()
    second = place(job)
    second = run(attempts.claim_attempt, second.id, second.fencing_token, worker="w2")
    succeed(run, second)

    # Only what it asked for: two starts, no end.
    assert broker.events() == ["start", "start"]
    deliveries = [r["headers"]["X-Gantry-Delivery"] for r in hooks.requests]
    assert deliveries == [f"{job.id}.start.1", f"{job.id}.start.2"]
    assert [delivered(r, org)["attempt"] for r in hooks.requests] == [1, 2]


# --- best effort: never in the job's way ------------------------------------------------


def test_a_broker_outage_loses_start_and_progress_but_never_fails_the_claim_or_a_heartbeat(
    org, broker, run
):
    broker.down = True
    job, attempt = scheduled_job(org, url="https://hooks.test/in", events=EVERY_EVENT)

    attempt = run(attempts.claim_attempt, attempt.id, attempt.fencing_token, worker="w1")
    signal = run(attempts.heartbeat, attempt, gpu_ms=100, charged=0, seq=1, progress=0.4)

    assert attempt is not None and signal is not None and not signal.cancel
    job.refresh_from_db()
    assert (job.status, job.progress) == (JobStatus.RUNNING, 0.4)
    assert broker.published == []


def test_a_failing_endpoint_gets_start_three_quick_tries_and_progress_one_and_no_log_notes(org):
    with override_settings(**LOCAL_HOOKS), HookServer(statuses=[500]) as server:
        job = JobFactory(
            org=org, status=JobStatus.RUNNING, webhook_url=server.url, webhook_events=EVERY_EVENT
        )
        Job.objects.filter(pk=job.pk).update(progress=0.3)
        starts = [
            webhooks.deliver_job_event(job.id, event="start", attempt=1, try_number=n)
            for n in (1, 2, 3)
        ]
        progress = webhooks.deliver_job_event(job.id, event="progress")
        assert len(server.requests) == 4

    assert [outcome.retry_in for outcome in starts] == [1.0, 2.0, None]
    assert all(not outcome.delivered for outcome in [*starts, progress])
    assert progress.retry_in is None and progress.detail == "HTTP 500"
    # The job's log holds no webhook outcome, so the completed delivery is untouched.
    assert not JobEvent.objects.filter(job=job, data__has_key="webhook").exists()


def test_a_delivery_task_run_twice_posts_once(org, hooks):
    job = JobFactory(
        org=org, status=JobStatus.RUNNING, webhook_url=hooks.url, webhook_events=EVERY_EVENT
    )
    Job.objects.filter(pk=job.pk).update(progress=0.5)

    for _ in range(2):
        webhooks.deliver_job_event(job.id, event="start", attempt=1, try_number=1)
        webhooks.deliver_job_event(job.id, event="progress")

    assert [r["headers"]["X-Gantry-Event"] for r in hooks.requests] == [
        "job.start",
        "job.progress",
    ]


def test_progress_found_after_the_job_ended_is_dropped_for_its_completed_delivery(org, hooks):
    job = JobFactory(
        org=org, status=JobStatus.SUCCEEDED, webhook_url=hooks.url, webhook_events=EVERY_EVENT
    )
    outcome = webhooks.deliver_job_event(job.id, event="progress")
    assert (outcome.delivered, outcome.detail) == (False, "no longer running")
    assert hooks.requests == []


def test_a_job_that_did_not_ask_for_completed_gets_no_end_delivery_and_no_redelivery(
    org, django_capture_on_commit_callbacks
):
    job = JobFactory(
        org=org,
        status=JobStatus.RUNNING,
        webhook_url="https://hooks.test/in",
        webhook_events=["start", "progress"],
    )
    with django_capture_on_commit_callbacks() as callbacks:
        end_job(job.id, to=JobStatus.SUCCEEDED, reason="done", actor="test")
    assert not [cb for cb in callbacks if getattr(cb, "func", None) is webhooks.enqueue_delivery]
    assert webhooks.deliver_job_webhook(job.id, try_number=1).detail == "nothing to deliver"

    Job.objects.filter(pk=job.pk).update(finished_at=timezone.now() - timedelta(hours=2))
    assert webhooks.redeliver_stranded() == 0


# --- the submission field -----------------------------------------------------------------


def test_a_submission_keeps_its_events_in_the_order_a_job_lives_them(tenant, project):
    body = spec_body(
        project="video",
        webhook_url="https://93.184.216.34/hook",
        webhook_events=["completed", "start"],
    )
    response = submit(tenant, body)
    assert response.status_code == 202, response.content
    assert response.json()["webhook_events"] == ["start", "completed"]
    assert Job.objects.get(pk=response.json()["id"]).webhook_events == ["start", "completed"]
    # Read back the same way.
    job_id = response.json()["id"]
    assert tenant.get(f"/v1/jobs/{job_id}").json()["webhook_events"] == ["start", "completed"]


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"webhook_events": ["start"]}, id="events-without-a-url"),
        pytest.param(
            {"webhook_url": "https://93.184.216.34/hook", "webhook_events": ["start", "start"]},
            id="a-duplicate",
        ),
        pytest.param(
            {"webhook_url": "https://93.184.216.34/hook", "webhook_events": ["finished"]},
            id="an-unknown-event",
        ),
        pytest.param(
            {"webhook_url": "https://93.184.216.34/hook", "webhook_events": "start"},
            id="not-a-list",
        ),
    ],
)
def test_a_wrong_webhook_events_field_is_a_400_naming_it_and_holds_nothing(
    tenant, project, changes
):
    response = submit(tenant, spec_body(project="video", **changes))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "webhook_events" and error["message"].startswith("webhook_events: ")
    assert not Job.objects.exists() and not Hold.objects.exists()


# --- end to end through a real Celery worker ----------------------------------------------


@pytest.fixture
def control_worker(transactional_db, tmp_path):
    """A control-queue worker that may deliver to this machine's test hook server."""
    worker = harness.control_worker(
        tmp_path,
        extra_env={
            "GANTRY_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
            "GANTRY_WEBHOOK_ALLOW_HTTP": "true",
        },
    )
    yield worker.log
    worker.stop(grace=15)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_worker_delivers_start_progress_and_completed_in_turn(control_worker):
    reset_job_state()
    org = funded_org()
    with HookServer() as hooks:
        job, attempt = scheduled_job(org, url=hooks.url, events=EVERY_EVENT)

        # Each step commits and queues its delivery; the next waits for it to arrive.
        attempt = attempts.claim_attempt(attempt.id, attempt.fencing_token, worker="w1")
        assert len(hooks.wait_for(1, timeout=30)) == 1, control_worker()[-3000:]
        attempts.heartbeat(attempt, gpu_ms=100, charged=0, seq=1, progress=0.5)
        assert len(hooks.wait_for(2, timeout=30)) == 2, control_worker()[-3000:]
        end_job(job.id, to=JobStatus.SUCCEEDED, reason="done", actor="test")
        requests = hooks.wait_for(3, timeout=30)
        assert len(requests) == 3, control_worker()[-3000:]

    bodies = [delivered(request, org) for request in requests]
    assert [(b["event"], b["status"]) for b in bodies] == [
        ("start", "running"),
        ("progress", "running"),
        ("completed", "succeeded"),
    ]
    assert bodies[1]["progress"] == 0.5
