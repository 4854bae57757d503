"""Cancelling a job in each state, through the API."""

import pytest

from apps.jobs.models import AttemptState, ExitClass, GpuAssignment, Job, JobEvent, JobStatus
from apps.jobs.services.outcomes import end_job, requeue_job
from apps.ledger import services as ledger
from apps.ledger.models import HoldState
from tests.factories import ProjectFactory
from tests.jobs.factories import JobFactory, place

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]


def job_in(org, status, **fields):
    return JobFactory(
        org=org, project=ProjectFactory(org=org), status=status, with_hold=True, **fields
    )


def test_cancel_while_queued_cancels_and_releases_the_hold_at_once(tenant, org):
    job = job_in(org, JobStatus.QUEUED)
    response = tenant.post(f"/v1/jobs/{job.id}/cancel")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled" and body["finished_at"]
    assert body["hold"]["state"] == "released" and body["hold"]["charged"] == 0
    assert body["hold"]["refunded"] == body["hold"]["amount"]
    job.refresh_from_db()
    assert job.hold.state == HoldState.RELEASED


def test_cancel_while_scheduled_finishes_the_attempt_and_frees_its_gpus(tenant, org):
    job = job_in(org, JobStatus.SCHEDULED)
    attempt = place(job, gpus=2)
    response = tenant.post(f"/v1/jobs/{job.id}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert response.json()["hold"]["state"] == "released"
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FINISHED and attempt.exit_class == ExitClass.KILLED
    assert not GpuAssignment.objects.filter(attempt=attempt, released_at__isnull=True).exists()
    assert GpuAssignment.objects.filter(attempt=attempt).count() == 2


def test_cancel_while_running_asks_the_worker_and_charges_only_time_used(tenant, org):
    job = job_in(org, JobStatus.RUNNING)
    attempt = place(job, state=AttemptState.RUNNING, started=True)
    events_before = JobEvent.objects.filter(job=job).count()

    response = tenant.post(f"/v1/jobs/{job.id}/cancel")

    # The worker has not stopped yet: still running, with the request recorded.
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "running" and body["cancel_requested"] is True
    assert body["hold"]["state"] == "active"
    assert JobEvent.objects.filter(job=job).count() == events_before + 1
    again = tenant.post(f"/v1/jobs/{job.id}/cancel")
    assert again.status_code == 200
    assert JobEvent.objects.filter(job=job).count() == events_before + 1

    # What the runner does on its next heartbeat: stop, and finish as cancelled at the
    # usage it measured (a tenth of the hold).
    used = job.hold.amount // 10
    ledger.meter(job.hold, cumulative_usage=used, seq=1, attempt_key=str(attempt.id))
    attempt.charged = used
    attempt.save(update_fields=["charged"])
    end_job(job.id, to=JobStatus.CANCELLED, reason="stopped", actor="worker", attempt=attempt)

    final = tenant.get(f"/v1/jobs/{job.id}").json()
    assert final["status"] == "cancelled"
    assert final["hold"]["state"] == "settled"
    assert final["hold"]["charged"] == used
    assert final["hold"]["refunded"] == final["hold"]["amount"] - used


def test_cancel_while_preempting_cancels_when_the_job_comes_back_to_the_queue(tenant, org):
    job = job_in(org, JobStatus.PREEMPTING)
    place(job, state=AttemptState.STOPPING, started=True)
    response = tenant.post(f"/v1/jobs/{job.id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "preempting"

    # The preemption completes: instead of waiting in the queue, the job is cancelled.
    returned = requeue_job(job.id, reason="preempted", actor="worker")

    assert returned.status == JobStatus.CANCELLED
    steps = list(JobEvent.objects.filter(job=job).values_list("from_status", "to_status"))
    assert steps[-2:] == [("preempting", "queued"), ("queued", "cancelled")]
    assert Job.objects.get(pk=job.pk).hold.state == HoldState.SETTLED


@pytest.mark.parametrize(
    "status",
    [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.CANCELLED],
)
def test_cancelling_a_finished_job_is_409_and_changes_nothing(tenant, org, status):
    job = JobFactory(org=org, status=status)
    events_before = JobEvent.objects.filter(job=job).count()
    response = tenant.post(f"/v1/jobs/{job.id}/cancel")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "job_finished"
    job.refresh_from_db()
    assert job.status == status and not job.cancel_requested
    assert JobEvent.objects.filter(job=job).count() == events_before


def test_cancel_replays_with_the_same_idempotency_key(tenant, org):
    job = job_in(org, JobStatus.QUEUED)
    first = tenant.post(f"/v1/jobs/{job.id}/cancel", HTTP_IDEMPOTENCY_KEY="c-1")
    again = tenant.post(f"/v1/jobs/{job.id}/cancel", HTTP_IDEMPOTENCY_KEY="c-1")
    without_key = tenant.post(f"/v1/jobs/{job.id}/cancel")
    assert (first.status_code, again.status_code, without_key.status_code) == (200, 200, 409)
    assert again.json()["status"] == "cancelled"
