"""start_deadline_s: a job not started in time ends cancelled (deadline_exceeded), its
hold released in full, and the dispatcher never places it.

Nothing here sleeps: a deadline is moved into the past with an UPDATE of
start_deadline_at, then the sweep (or the dispatcher) runs.
"""

import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from apps.jobs import tasks
from apps.jobs.models import Job, JobEvent, JobStatus
from apps.jobs.services import webhooks
from apps.jobs.services.deadlines import cancel_jobs_past_start_deadline
from apps.ledger.models import Entry, Hold, HoldState
from apps.scheduler.models import DecisionOutcome
from apps.scheduler.policy import Place
from apps.scheduler.services.dispatch import apply_placement, run_dispatch_tick
from apps.scheduler.services.snapshot import build_snapshot
from config.celery import app
from tests.jobs.factories import JobFactory, spec_body, submit
from tests.scheduler.factories import NodeFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]

LOCAL_HOOKS = {"GANTRY_WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "GANTRY_WEBHOOK_ALLOW_HTTP": True}


def available(tenant) -> int:
    return tenant.get("/v1/balance").json()["available"]


def miss_the_deadline(job_id) -> None:
    """As if the deadline had passed an hour ago (well before the test transaction's now())."""
    Job.objects.filter(pk=job_id).update(start_deadline_at=Now() - timedelta(hours=1))


def queued_ids() -> set[str]:
    return {job.id for job in build_snapshot().cluster.queued}


def submit_with_deadline(tenant, seconds=300, **body):
    response = submit(tenant, spec_body(project="video", start_deadline_s=seconds, **body))
    assert response.status_code == 202, response.content
    return response.json()


# --- submission -----------------------------------------------------------------------


def test_the_deadline_is_the_database_clock_at_submission_plus_the_seconds(tenant, project):
    body = submit_with_deadline(tenant, 300)

    job = Job.objects.get(pk=body["id"])
    # Both written by the same INSERT from the database clock.
    assert job.start_deadline_at == job.queued_at + timedelta(seconds=300)
    assert body["start_deadline_at"] == job.start_deadline_at.isoformat().replace("+00:00", "Z")
    assert tenant.get(f"/v1/jobs/{job.id}").json()["start_deadline_at"] == body["start_deadline_at"]


@pytest.mark.parametrize(
    "body", [spec_body(project="video"), spec_body(project="video", start_deadline_s=None)]
)
def test_no_deadline_when_the_field_is_absent_or_null(tenant, project, body):
    response = submit(tenant, body)

    assert response.status_code == 202, response.content
    assert response.json()["start_deadline_at"] is None
    assert Job.objects.get(pk=response.json()["id"]).start_deadline_at is None


@pytest.mark.parametrize("value", [0, -1, "soon", True])
def test_an_invalid_deadline_is_a_400_naming_the_field_and_holds_nothing(tenant, project, value):
    before = available(tenant)

    response = submit(tenant, spec_body(project="video", start_deadline_s=value))

    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == "start_deadline_s"
    assert not Job.objects.exists() and not Hold.objects.exists()
    assert available(tenant) == before


# --- expiry ---------------------------------------------------------------------------


def test_a_job_not_started_by_its_deadline_ends_cancelled_with_its_whole_hold_released(
    tenant, project, monkeypatch, django_capture_on_commit_callbacks
):
    before = available(tenant)
    with override_settings(**LOCAL_HOOKS):
        body = submit_with_deadline(tenant, 300, webhook_url="http://127.0.0.1:9/hook")
    assert available(tenant) == before - body["hold"]["amount"]
    entries_before = Entry.objects.count()
    miss_the_deadline(body["id"])
    delivered = []
    monkeypatch.setattr(webhooks, "enqueue_delivery", delivered.append)

    with django_capture_on_commit_callbacks(execute=True):
        cancelled = cancel_jobs_past_start_deadline()

    assert cancelled == [body["id"]]
    job = tenant.get(f"/v1/jobs/{body['id']}").json()
    assert job["status"] == "cancelled" and job["finished_at"]
    assert job["error"]["code"] == "deadline_exceeded"
    assert "start deadline" in job["error"]["message"]
    assert job["hold"]["state"] == HoldState.RELEASED
    assert job["hold"]["charged"] == 0 and job["hold"]["refunded"] == job["hold"]["amount"]
    assert available(tenant) == before
    assert Entry.objects.count() > entries_before  # the release is in the ledger
    event = JobEvent.objects.filter(job_id=body["id"]).latest("at", "id")
    assert (event.from_status, event.to_status, event.actor) == ("queued", "cancelled", "deadline")
    assert [str(job_id) for job_id in delivered] == [body["id"]]  # the terminal webhook


def test_running_the_sweep_twice_changes_nothing_the_second_time(tenant, project):
    body = submit_with_deadline(tenant)
    miss_the_deadline(body["id"])
    assert cancel_jobs_past_start_deadline() == [body["id"]]
    events, entries = JobEvent.objects.count(), Entry.objects.count()
    hold = Hold.objects.get(job__pk=body["id"])

    assert cancel_jobs_past_start_deadline() == []

    assert (JobEvent.objects.count(), Entry.objects.count()) == (events, entries)
    assert Hold.objects.get(pk=hold.pk).state == HoldState.RELEASED


def test_the_beat_task_runs_the_sweep_every_few_seconds(tenant, project):
    app.loader.import_default_modules()
    entry = settings.CELERY_BEAT_SCHEDULE["jobs-cancel-past-start-deadline"]
    assert entry["task"] == "gantry.jobs.cancel_jobs_past_start_deadline"
    assert entry["task"] in app.tasks
    assert entry["schedule"] == settings.GANTRY_START_DEADLINE_INTERVAL_S == 5.0
    assert entry["options"] == {"queue": "control", "expires": 5.0}
    body = submit_with_deadline(tenant)
    miss_the_deadline(body["id"])

    assert tasks.cancel_jobs_past_start_deadline() == 1

    assert Job.objects.get(pk=body["id"]).status == JobStatus.CANCELLED


def test_a_job_whose_deadline_is_still_ahead_is_left_queued(tenant, project):
    body = submit_with_deadline(tenant, 300)

    assert cancel_jobs_past_start_deadline() == []

    assert Job.objects.get(pk=body["id"]).status == JobStatus.QUEUED
    assert Hold.objects.get(job__pk=body["id"]).state == HoldState.ACTIVE


@pytest.mark.parametrize(
    ("status", "preemptions"),
    [(JobStatus.RUNNING, 0), (JobStatus.SCHEDULED, 0), (JobStatus.QUEUED, 1)],
    ids=["running", "scheduled", "preempted-and-requeued"],
)
def test_a_job_that_started_before_its_deadline_is_untouched(org, status, preemptions):
    started = None if status == JobStatus.SCHEDULED else timezone.now()
    job = JobFactory(
        org=org,
        status=status,
        with_hold=True,
        started_at=started,
        preemption_count=preemptions,
        attempt_count=1,
    )
    miss_the_deadline(job.id)
    events = JobEvent.objects.filter(job=job).count()

    assert cancel_jobs_past_start_deadline() == []

    job.refresh_from_db()
    assert job.status == status and job.error_code == ""
    assert job.hold.state == HoldState.ACTIVE
    assert JobEvent.objects.filter(job=job).count() == events


# --- the dispatcher -------------------------------------------------------------------


def test_the_dispatcher_never_places_a_job_past_its_deadline(org):
    NodeFactory(gpus=2)
    late = JobFactory(org=org, with_hold=True)
    on_time = JobFactory(
        org=org, with_hold=True, start_deadline_at=timezone.now() + timedelta(hours=1)
    )
    miss_the_deadline(late.id)

    assert queued_ids() == {str(on_time.id)}
    result = run_dispatch_tick()

    assert result.placed == 1
    late.refresh_from_db()
    on_time.refresh_from_db()
    assert late.status == JobStatus.QUEUED and late.attempt_count == 0
    assert on_time.status == JobStatus.SCHEDULED
    assert cancel_jobs_past_start_deadline() == [str(late.id)]


def test_a_job_that_started_once_stays_in_the_snapshot_past_its_deadline(org):
    resumed = JobFactory(org=org, started_at=timezone.now(), preemption_count=1, attempt_count=1)
    miss_the_deadline(resumed.id)

    assert queued_ids() == {str(resumed.id)}


def test_a_placement_decided_before_the_deadline_is_refused_after_it(org):
    node = NodeFactory(gpus=1)
    job = JobFactory(org=org, with_hold=True, start_deadline_at=timezone.now() + timedelta(hours=1))
    assert queued_ids() == {str(job.id)}
    [gpu_id] = node.gpus.values_list("id", flat=True)
    decision = Place(job_id=job.pk, node=node.name, gpu_ids=(gpu_id,), gpu_type="H100", reason="x")
    miss_the_deadline(job.id)  # between the snapshot and the placement

    outcome = apply_placement(decision, tick=uuid.uuid4())

    assert outcome.outcome == DecisionOutcome.SKIPPED
    assert "start deadline" in outcome.skip_reason
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and job.attempt_count == 0
    assert not job.attempts.exists()
