"""Recovery services: lost leases, stranded holds; each safe to run twice at once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.jobs.models import Attempt, AttemptState, ExitClass, Job, JobEvent, JobStatus
from apps.jobs.services import recovery, stop_requests
from apps.ledger import services as ledger
from apps.ledger.models import Hold, HoldState
from tests.jobs.factories import JobFactory, place

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_backoff(settings):
    settings.GANTRY_RETRY_BACKOFF_S = 0.1


def running_job(
    *,
    charged=1234,
    gpu_ms=5000,
    lease_past=True,
    status=JobStatus.RUNNING,
    worker="h100-1@host-a",
    **kw,
):
    """A job whose worker heartbeated `charged` µc of usage and then went silent."""
    job = JobFactory(status=status, with_hold=True, **kw)
    attempt = place(job, state=AttemptState.RUNNING, started=True)
    lease = timezone.now() - timedelta(seconds=5) if lease_past else timezone.now() + timedelta(1)
    Attempt.objects.filter(pk=attempt.pk).update(
        gpu_ms=gpu_ms,
        charged=charged,
        lease_expires_at=lease,
        checkpoint_ref="step-3",
        worker=worker,
    )
    Job.objects.filter(pk=job.pk).update(checkpoint_ref="step-3")
    attempt.refresh_from_db()
    return job, attempt


def test_a_lost_attempt_is_finished_its_gpus_freed_and_its_job_requeued_with_its_checkpoint():
    job, attempt = running_job()

    reaped = recovery.reap_expired_leases()

    assert [r.attempt_id for r in reaped] == [str(attempt.pk)]
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.state == AttemptState.FINISHED
    assert attempt.exit_class == ExitClass.LOST
    assert not attempt.assignments.filter(released_at__isnull=True).exists()
    assert job.status == JobStatus.QUEUED
    assert job.checkpoint_ref == "step-3"
    assert job.not_before is not None
    hold = Hold.objects.get(pk=job.hold_id)
    assert hold.state == HoldState.ACTIVE
    assert hold.usage == 1234  # what the dead worker reported stays charged
    assert recovery.reap_expired_leases() == []  # the second run finds nothing


def test_a_live_lease_is_left_alone():
    _job, attempt = running_job(lease_past=False)

    assert recovery.reap_expired_leases() == []
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING


def test_a_job_lost_on_its_last_attempt_is_dead_lettered_and_charged_what_it_used():
    job, _attempt = running_job(max_attempts=1)

    recovery.reap_expired_leases()

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_code == "dead_letter"
    hold = Hold.objects.get(pk=job.hold_id)
    assert hold.state == HoldState.SETTLED
    assert hold.captured == 1234
    assert hold.refunded == hold.amount - 1234
    assert ledger.reconcile(record=False) == []


def test_a_job_lost_while_being_preempted_goes_back_to_the_queue_as_preempted():
    job, _attempt = running_job(status=JobStatus.PREEMPTING)

    recovery.reap_expired_leases()

    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert job.preemption_count == 1


def test_a_job_lost_after_a_cancel_request_is_cancelled_and_charged():
    job, _attempt = running_job(cancel_requested=True)

    recovery.reap_expired_leases()

    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert Hold.objects.get(pk=job.hold_id).captured == 1234
    assert ledger.reconcile(record=False) == []


def test_a_restarted_worker_ends_what_its_previous_process_held_without_waiting_for_leases():
    job, attempt = running_job(lease_past=False)
    _other_job, other = running_job(lease_past=False, worker="a100-1@host-a")

    reaped = recovery.reap_attempts_of_restarted_worker(worker="h100-1@host-a")

    assert [r.attempt_id for r in reaped] == [str(attempt.pk)]
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert (attempt.state, attempt.exit_class) == (AttemptState.FINISHED, ExitClass.LOST)
    assert attempt.error_message == recovery.RESTARTED_MESSAGE
    assert not attempt.assignments.filter(released_at__isnull=True).exists()
    assert job.status == JobStatus.QUEUED
    assert job.checkpoint_ref == "step-3"
    requeue = JobEvent.objects.get(job=job, to_status=JobStatus.QUEUED, from_status="running")
    assert requeue.reason.startswith(recovery.RESTARTED_MESSAGE)
    assert Hold.objects.get(pk=job.hold_id).usage == 1234
    other.refresh_from_db()
    assert other.state == AttemptState.RUNNING  # another worker's run is left alone
    assert recovery.reap_attempts_of_restarted_worker(worker="h100-1@host-a") == []
    assert recovery.reap_expired_leases() == []
    assert ledger.reconcile(record=False) == []


def test_a_restarted_worker_leaves_an_attempt_the_reaper_ended_first_as_it_was():
    job, _attempt = running_job()
    assert len(recovery.reap_expired_leases()) == 1

    assert recovery.reap_attempts_of_restarted_worker(worker="h100-1@host-a") == []
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.QUEUED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_reapers_at_once_reap_each_attempt_once():
    jobs = [running_job()[0] for _ in range(6)]
    barrier = threading.Barrier(2)
    counts = []

    def reap():
        try:
            barrier.wait()
            counts.append(len(recovery.reap_expired_leases()))
        finally:
            connection.close()

    threads = [threading.Thread(target=reap) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(counts) == 6
    for job in jobs:
        requeues = JobEvent.objects.filter(job=job, from_status="running", to_status="queued")
        assert requeues.count() == 1
    assert ledger.reconcile(record=False) == []


def test_a_finished_job_with_an_open_hold_is_settled_at_its_attempts_usage():
    job = JobFactory(status=JobStatus.SUCCEEDED, with_hold=True)
    attempt = place(job, state=AttemptState.FINISHED, started=True)
    Attempt.objects.filter(pk=attempt.pk).update(charged=777, gpu_ms=700)

    assert recovery.close_stranded_holds() == 1

    hold = Hold.objects.get(pk=job.hold_id)
    assert hold.state == HoldState.SETTLED
    assert hold.captured == 777
    assert recovery.close_stranded_holds() == 0
    assert ledger.reconcile(record=False) == []


def test_a_finished_job_that_never_ran_has_its_hold_released():
    job = JobFactory(status=JobStatus.CANCELLED, with_hold=True)

    assert recovery.close_stranded_holds() == 1

    hold = Hold.objects.get(pk=job.hold_id)
    assert hold.state == HoldState.RELEASED
    assert hold.refunded == hold.amount


def test_a_waiting_job_whose_hold_expired_fails_and_frees_its_placement():
    job = JobFactory(status=JobStatus.SCHEDULED, with_hold=True)
    attempt = place(job)
    Hold.objects.filter(pk=job.hold_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert ledger.expire_stale_holds() == 1

    assert recovery.close_stranded_holds() == 1

    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_code == "hold_expired"
    assert attempt.state == AttemptState.FINISHED
    assert not attempt.assignments.filter(released_at__isnull=True).exists()
    assert ledger.reconcile(record=False) == []


def test_a_running_job_whose_hold_expired_fails_and_its_worker_is_told_at_once(
    django_capture_on_commit_callbacks,
):
    job, _attempt = running_job(lease_past=False)
    Hold.objects.filter(pk=job.hold_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert ledger.expire_stale_holds() == 1

    with stop_requests.watch(job.pk) as stop_nudged:
        with django_capture_on_commit_callbacks(execute=True):
            assert recovery.close_stranded_holds() == 1
        assert stop_nudged.wait(5)

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and job.error_code == "hold_expired"
