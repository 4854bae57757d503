"""A cancel or a preemption reaches the running attempt's worker at once, not at its next
heartbeat: a nudge on the job's stop channel (real Redis), and, end to end, a real
GPU-pool worker whose heartbeats are 30 s apart."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from django.conf import settings

from apps.jobs.models import Attempt, AttemptState, ExitClass, Job, JobEvent, JobStatus
from apps.jobs.services import stop_requests
from apps.jobs.services.cancel import cancel_job
from tests.jobs.factories import funded_org
from tests.ledger.assertions import assert_ledger_exact
from tests.worker_harness import Beat, WorkerPool, submit_job


@pytest.mark.django_db
def test_a_watched_job_is_nudged_when_its_stop_is_announced_and_no_other_is(
    django_capture_on_commit_callbacks,
):
    job, other = uuid.uuid4(), uuid.uuid4()
    with stop_requests.watch(job) as nudged, stop_requests.watch(other) as other_nudged:
        with django_capture_on_commit_callbacks(execute=True):
            stop_requests.announce_stop_requested(job)
            assert not nudged.is_set()  # not before the change commits
        assert nudged.wait(5)
        assert not other_nudged.wait(0.3)


# --------------------------------------------------------------------------- end to end

# Heartbeats 30 s apart: a stop that came by heartbeat would take tens of seconds.
SLOW_HEARTBEATS = {"GANTRY_HEARTBEAT_S": "30", "GANTRY_LEASE_S": "90"}


@pytest.fixture(scope="module")
def slow_heartbeat_workers(django_db_setup, tmp_path_factory):
    pool = WorkerPool(tmp_path_factory.mktemp("workers"))
    pool.media_root.mkdir()
    pool.scratch_root.mkdir()
    try:
        pool.start("e2e-h100", extra_env=SLOW_HEARTBEATS)
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def beat(slow_heartbeat_workers, settings):
    beat = Beat.over(slow_heartbeat_workers, settings)
    yield beat
    beat.drain(timeout=30, dispatch=True)


def _running_and_listening(beat: Beat, job: Job) -> None:
    """Tick until the job's attempt runs and its runner listens on the stop channel."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    channel = stop_requests.channel_of(job.pk)
    beat.until(lambda: client.pubsub_numsub(channel)[0][1] >= 1, timeout=30)


def _finished(job: Job) -> bool:
    return Job.objects.get(pk=job.pk).is_terminal


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_running_job_is_stopped_within_seconds_of_its_cancel_not_at_its_next_heartbeat(
    beat, slow_heartbeat_workers
):
    org = funded_org()
    job = submit_job(org, prompt="a long fox", steps=400, step_seconds=0.05)  # 20 s
    _running_and_listening(beat, job)

    asked = time.monotonic()
    cancel_job(job.pk, actor="test")
    beat.until(lambda: _finished(job), timeout=30, every=0.05)
    took = time.monotonic() - asked

    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED, slow_heartbeat_workers.logs()
    assert took < 5, f"stopped {took:.1f} s after the cancel (heartbeats are 30 s apart)"
    (attempt,) = job.attempts.all()
    assert attempt.exit_class == ExitClass.KILLED
    assert_ledger_exact(job)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_preempted_job_stops_within_seconds_and_the_enterprise_job_starts(
    beat, slow_heartbeat_workers
):
    free = funded_org(tier="free")
    victim = submit_job(free, prompt="a free fox", steps=400, step_seconds=0.05, gpu_count=2)
    _running_and_listening(beat, victim)

    urgent = submit_job(funded_org(tier="enterprise"), prompt="an urgent fox", preemptible=False)
    beat.until(
        lambda: JobEvent.objects.filter(job=victim, to_status=JobStatus.PREEMPTING).exists(),
        timeout=30,
    )
    asked = time.monotonic()
    beat.until(
        lambda: not Attempt.objects.filter(job=victim, state=AttemptState.RUNNING).exists(),
        timeout=30,
        every=0.05,
    )
    took = time.monotonic() - asked
    assert took < 5, f"the victim stopped {took:.1f} s after its preemption (heartbeats: 30 s)"
    beat.until(lambda: _finished(urgent), timeout=30)
    assert Job.objects.get(pk=urgent.pk).status == JobStatus.SUCCEEDED
    beat.until(lambda: _finished(victim), timeout=60)
    victim.refresh_from_db()
    assert victim.status == JobStatus.SUCCEEDED and victim.preemption_count == 1
    assert_ledger_exact(victim)
