"""End to end: real PostgreSQL, Redis and Celery GPU-pool workers started by the tests.

The test process submits jobs through the jobs service and plays the beat (dispatch
tick, lease reaper, unclaimed-attempt recovery, usage fold); the workers claim, run the
stand-in generator, heartbeat and finish. Every scenario ends with the ledger's
reconciler finding nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.jobs.models import ExitClass, Job, JobEvent, JobStatus
from apps.jobs.serializers import job_body
from apps.jobs.services.cancel import cancel_job
from apps.ledger.models import Entry
from tests.jobs.factories import funded_org
from tests.ledger.assertions import assert_ledger_exact
from tests.worker_harness import (
    Beat,
    pool_fixture,
    submit_job,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

workers = pool_fixture("e2e-h100", "e2e-a100")


@pytest.fixture
def beat(workers, settings):
    beat = Beat.over(workers, settings)
    yield beat
    beat.drain(timeout=15, dispatch=True)


def finished(job) -> bool:
    return Job.objects.get(pk=job.pk).is_terminal


def statuses(job) -> list[tuple[str, str]]:
    return [
        (e.from_status, e.to_status)
        for e in JobEvent.objects.filter(job=job).order_by("at", "id")
        if e.from_status != e.to_status
    ]


def test_job_goes_queued_to_succeeded_with_a_result_and_an_exact_charge(beat, workers):
    org = funded_org()
    job = submit_job(org, prompt="a red fox in snow", steps=6, step_seconds=0.05)

    beat.until(lambda: finished(job), timeout=30)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.error_code, job.error_message, workers.logs())
    assert statuses(job) == [
        ("", "queued"),
        ("queued", "scheduled"),
        ("scheduled", "running"),
        ("running", "succeeded"),
    ]
    result = Path(workers.media_root) / "results" / job.result_path
    assert result.read_bytes()[:6] == b"GIF89a"
    assert job.progress == 1.0
    (attempt,) = job.attempts.all()
    assert attempt.exit_class == ExitClass.SUCCEEDED
    assert attempt.exit_code == 0
    assert attempt.node.name == "e2e-h100"
    assert attempt.gpu_ms >= 6 * 50  # six steps of 50 ms on one GPU at least
    assert attempt.charged > 0
    assert not attempt.assignments.filter(released_at__isnull=True).exists()
    assert_ledger_exact(job)


def test_crashing_job_is_retried_then_fails_with_its_error(beat, workers):
    org = funded_org()
    job = submit_job(org, prompt="a fox !crash", steps=6, step_seconds=0.05)

    beat.until(lambda: finished(job), timeout=45)

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED, workers.logs()
    assert job.error_code == "crashed"
    assert "simulated generator crash" in job.error_message
    assert "Gave up after 3 failed attempts" in job.error_message
    attempts = list(job.attempts.order_by("number"))
    assert [a.exit_class for a in attempts] == [ExitClass.CRASHED] * 3
    assert [a.exit_code for a in attempts] == [1, 1, 1]
    assert statuses(job).count(("running", "queued")) == 2
    assert_ledger_exact(job)


def test_hung_generator_is_detected_and_killed(beat, workers):
    org = funded_org()
    job = submit_job(org, prompt="a fox !hang", steps=20, step_seconds=0.05)
    Job.objects.filter(pk=job.pk).update(max_attempts=1)

    beat.until(lambda: finished(job), timeout=30)

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED, workers.logs()
    assert job.error_code == "hung"
    (attempt,) = job.attempts.all()
    assert attempt.exit_class == ExitClass.HUNG
    assert attempt.exit_code == -9  # SIGKILL: it ignores SIGTERM
    assert job.progress == pytest.approx(3 / 20)  # the three steps it made before hanging
    assert_ledger_exact(job)


def test_out_of_memory_is_classified_retried_once_then_failed(beat, workers):
    org = funded_org()
    job = submit_job(org, prompt="a fox !oom", steps=4, step_seconds=0.05)

    beat.until(lambda: finished(job), timeout=30)

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED, workers.logs()
    assert job.error_code == "oom"
    assert "CUDA out of memory" in job.error_message
    attempts = list(job.attempts.order_by("number"))
    assert [(a.exit_class, a.exit_code) for a in attempts] == [(ExitClass.OOM, 137)] * 2
    assert_ledger_exact(job)


def test_cancel_while_running_charges_only_time_used(beat, workers):
    org = funded_org()
    steps, step_seconds = 200, 0.05  # ten seconds if it ran to the end
    job = submit_job(org, prompt="a long fox", steps=steps, step_seconds=step_seconds)
    beat.until(lambda: Job.objects.get(pk=job.pk).progress >= 0.05, timeout=30)

    cancel_job(job.pk, actor="test")
    beat.until(lambda: finished(job), timeout=15)

    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED, workers.logs()
    (attempt,) = job.attempts.all()
    assert attempt.exit_class == ExitClass.KILLED
    assert 0 < attempt.gpu_ms < steps * step_seconds * 1000
    assert 0 < job.hold.captured < job.hold.amount
    assert_ledger_exact(job)


def test_a_running_job_is_charged_live_and_captured_once_per_interval(beat, workers, settings):
    # The harness captures every 2 s (8 heartbeats; the platform: a minute, 30).
    org = funded_org()
    job = submit_job(org, prompt="a slow fox", steps=40, step_seconds=0.2)  # about 8 s
    live_ahead_of_ledger = []

    def watch() -> bool:
        current = Job.objects.select_related("hold").get(pk=job.pk)
        body = job_body(current)
        if current.status == JobStatus.RUNNING and current.hold.usage > current.hold.captured:
            live_ahead_of_ledger.append(body["hold"]["charged"])
        return current.is_terminal

    beat.until(watch, timeout=60)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.error_code, job.error_message, workers.logs())
    assert live_ahead_of_ledger and max(live_ahead_of_ledger) > 0  # the body reads live usage
    (attempt,) = job.attempts.all()
    ran_s = (attempt.finished_at - attempt.started_at).total_seconds()
    interval = settings.GANTRY_LEDGER_CAPTURE_INTERVAL_S
    captures = (
        Entry.objects.filter(hold=job.hold, kind="capture", account="captured")
        .values("txn")
        .distinct()
        .count()
    )
    # At most one per interval of running, plus the final report's and the settlement's
    # (a heartbeat every 0.25 s would have made about 4 per interval).
    assert 1 <= captures <= ran_s / interval + 2, (captures, ran_s)
    assert_ledger_exact(job)
