"""The runner service in this process: claims, the real generator subprocess, finishes.

No Celery here (see test_worker_e2e / test_faults for real workers): run_attempt is
called directly, in a thread where a test needs to act on the job while it runs.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from apps.jobs import selectors
from apps.jobs.models import (
    Attempt,
    AttemptState,
    ExitClass,
    Job,
    JobEvent,
    JobStatus,
    QuarantinedFingerprint,
)
from apps.jobs.services import exits, quarantine, runner
from apps.jobs.services.lifecycle import transition
from apps.ledger import services as ledger
from apps.ledger.models import HoldState
from tests.jobs.factories import JobFactory, place
from tests.ledger.assertions import charge_of

STEP_S = 0.05


@pytest.fixture(autouse=True)
def fast_runner(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.GANTRY_CHECKPOINT_ROOT = tmp_path / "media" / "checkpoints"
    settings.GANTRY_SCRATCH_ROOT = tmp_path / "scratch"
    settings.GANTRY_HEARTBEAT_S = 0.1
    settings.GANTRY_LEASE_S = 5
    settings.GANTRY_STALL_S = 1.5
    settings.GANTRY_PREEMPT_GRACE_S = 2
    settings.GANTRY_RETRY_BACKOFF_S = 0.1
    settings.GANTRY_QUARANTINE_NODES = 2
    settings.GANTRY_GENERATOR_COMMAND = []


def scheduled_job(*, prompt="a red fox", steps=4, gpus=1, **fields):
    params = {"prompt": prompt, "seed": 3, "steps": steps, "step_seconds": STEP_S}
    job = JobFactory(
        status=JobStatus.SCHEDULED, params=params, gpu_count=gpus, with_hold=True, **fields
    )
    return job, place(job, gpus=gpus)


def requeued_attempt(job: Job) -> Attempt:
    """Place a job that went back to the queue again (as the next dispatch would)."""
    Job.objects.filter(pk=job.pk).update(not_before=None)
    transition(job.pk, to=JobStatus.SCHEDULED, reason="placed again", actor="test")
    job.refresh_from_db()
    return place(job, gpus=job.gpu_count)


def in_thread(target, *args, **kwargs):
    """Run target in a thread with its own DB connection; returns (thread, result list)."""
    result = []

    def run():
        try:
            result.append(target(*args, **kwargs))
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def wait_for(condition, *, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


# --------------------------------------------------------------------------- pure parts


def test_usage_is_floored_micro_credits_of_gpu_milliseconds():
    # 1 GPU-hour at 4 credits/h costs exactly 4 credits; one GPU-ms less costs 1 µc less.
    assert exits.usage_micro_credits(gpu_ms=3_600_000, price_per_gpu_hour=4_000_000) == 4_000_000
    assert exits.usage_micro_credits(gpu_ms=3_599_999, price_per_gpu_hour=4_000_000) == 3_999_998
    assert exits.usage_micro_credits(gpu_ms=899, price_per_gpu_hour=4_000_000) == 998


@pytest.mark.parametrize(
    ("returncode", "stop", "stderr", "files", "expected"),
    [
        (0, "", "", 1, ExitClass.SUCCEEDED),
        (0, "", "", 0, ExitClass.CRASHED),
        (1, "", "RuntimeError: boom", 0, ExitClass.CRASHED),
        (137, "", "", 0, ExitClass.OOM),
        (1, "", "torch.OutOfMemoryError: CUDA out of memory.", 0, ExitClass.OOM),
        (2, "", "'steps' must be an integer", 0, ExitClass.BAD_INPUT),
        (-9, ExitClass.HUNG, "", 0, ExitClass.HUNG),
        (-9, ExitClass.TIMED_OUT, "", 0, ExitClass.TIMED_OUT),
        (-9, ExitClass.KILLED, "", 0, ExitClass.KILLED),
        (143, ExitClass.PREEMPTED, "", 0, ExitClass.PREEMPTED),
        (0, ExitClass.PREEMPTED, "", 1, ExitClass.SUCCEEDED),
        (-11, "", "", 0, ExitClass.NODE_FAULT),
    ],
)
def test_exit_classification(returncode, stop, stderr, files, expected, tmp_path):
    outputs = [tmp_path / f"out-{i}.gif" for i in range(files)]
    exit_class, message = exits.classify_exit(
        returncode=returncode, stop_reason=stop, stderr_tail=stderr, output_files=outputs
    )
    assert exit_class == expected
    assert (message == "") == (expected == ExitClass.SUCCEEDED)


def test_backoff_doubles_per_failure_up_to_its_cap(settings):
    settings.GANTRY_RETRY_BACKOFF_S = 10
    settings.GANTRY_RETRY_BACKOFF_MAX_S = 60
    assert [exits.retry_backoff_s(n) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]


# --------------------------------------------------------------------------- claims


@pytest.mark.django_db
def test_a_stale_token_or_a_second_delivery_claims_nothing():
    job, attempt = scheduled_job()
    events = JobEvent.objects.filter(job=job).count()

    stale = runner.run_attempt(attempt.pk, attempt.fencing_token - 1, worker="w1")

    assert stale.claimed is False
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.SCHEDULED
    assert JobEvent.objects.filter(job=job).count() == events

    first = runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")
    again = runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w2")

    assert first.claimed and first.exit_class == ExitClass.SUCCEEDED
    assert again.claimed is False
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.RUNNING).count() == 1


@pytest.mark.django_db
def test_a_delivery_for_a_job_cancelled_before_it_started_gives_the_gpus_back():
    job, attempt = scheduled_job()
    Job.objects.filter(pk=job.pk).update(status=JobStatus.CANCELLED, finished_at=job.queued_at)

    outcome = runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")

    assert outcome.claimed is False
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FINISHED
    assert attempt.exit_class == ExitClass.KILLED
    assert not attempt.assignments.filter(released_at__isnull=True).exists()


# --------------------------------------------------------------------------- runs


@pytest.mark.django_db
def test_success_stores_the_result_and_settles_the_hold_at_the_measured_usage(settings):
    job, attempt = scheduled_job(steps=5, gpus=2)

    outcome = runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")

    assert (outcome.exit_class, outcome.job_status) == (ExitClass.SUCCEEDED, JobStatus.SUCCEEDED)
    job.refresh_from_db()
    attempt.refresh_from_db()
    stored = Path(settings.MEDIA_ROOT) / "results" / job.result_path
    assert stored.read_bytes()[:6] == b"GIF89a"
    assert job.progress == 1.0
    assert job.started_at is not None and job.finished_at is not None
    assert attempt.state == AttemptState.FINISHED
    assert attempt.gpu_ms >= 2 * 5 * STEP_S * 1000  # two GPUs, five steps at least
    assert attempt.charged == charge_of(attempt)
    assert attempt.checkpoint_ref == "step-5"
    hold = job.hold
    hold.refresh_from_db()
    assert hold.state == HoldState.SETTLED
    assert hold.captured == attempt.charged
    assert hold.refunded == hold.amount - attempt.charged
    assert not attempt.assignments.filter(released_at__isnull=True).exists()
    assert not (Path(settings.GANTRY_SCRATCH_ROOT) / str(attempt.pk)).exists()
    assert ledger.reconcile(record=False) == []


@pytest.mark.django_db
def test_the_generator_sees_exactly_the_attempts_devices(settings, tmp_path):
    script = tmp_path / "devices.py"
    script.write_text(
        "import os, sys\n"
        "out = sys.argv[sys.argv.index('--output-dir') + 1]\n"
        "open(os.path.join(out, 'devices.txt'), 'w').write(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    )
    settings.GANTRY_GENERATOR_COMMAND = [sys.executable, str(script)]
    job, attempt = scheduled_job(gpus=3)
    attempt.devices = "GPU-a,GPU-b,GPU-c"
    attempt.save(update_fields=["devices"])

    runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert (Path(settings.MEDIA_ROOT) / "results" / job.result_path).read_text() == (
        "GPU-a,GPU-b,GPU-c"
    )


@pytest.mark.django_db
def test_bad_input_fails_at_once_with_the_generators_message():
    job, attempt = scheduled_job()
    Job.objects.filter(pk=job.pk).update(params={"prompt": "a fox", "steps": "many"})

    outcome = runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")

    assert outcome.exit_class == ExitClass.BAD_INPUT
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_code == "bad_input"
    assert "'steps' must be an integer" in job.error_message
    assert job.attempts.count() == 1
    assert ledger.reconcile(record=False) == []


@pytest.mark.django_db
def test_running_past_max_runtime_times_out_and_bills_exactly_the_limit():
    job, attempt = scheduled_job(steps=200, max_runtime_s=1)

    outcome = runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")

    assert outcome.exit_class == ExitClass.TIMED_OUT
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == JobStatus.TIMED_OUT
    assert job.error_code == "timed_out"
    assert attempt.gpu_ms == 1000  # never billed past max_runtime_s
    job.hold.refresh_from_db()
    assert job.hold.captured == charge_of(attempt) == 1000 * 4_000_000 // 3_600_000


@pytest.mark.django_db
def test_max_runtime_counts_the_time_of_earlier_attempts(settings):
    job, attempt = scheduled_job(steps=200, max_runtime_s=2)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.FINISHED, exit_class=ExitClass.CRASHED, gpu_ms=1500
    )
    attempt.assignments.update(released_at=job.queued_at)
    job.refresh_from_db()
    second = place(job)

    runner.run_attempt(second.pk, second.fencing_token, worker="w1")

    second.refresh_from_db()
    assert second.exit_class == ExitClass.TIMED_OUT
    assert second.gpu_ms == 500  # 2 s of runtime minus the 1.5 s already used


@pytest.mark.django_db(transaction=True)
def test_cancel_requested_while_running_stops_it_and_charges_the_time_used():
    job, attempt = scheduled_job(steps=200)
    thread, result = in_thread(runner.run_attempt, attempt.pk, attempt.fencing_token, worker="w")
    wait_for(lambda: Job.objects.get(pk=job.pk).progress > 0)

    Job.objects.filter(pk=job.pk).update(cancel_requested=True)
    thread.join(timeout=20)

    (outcome,) = result
    assert outcome.exit_class == ExitClass.KILLED
    job.refresh_from_db()
    attempt.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert 0 < attempt.gpu_ms < 200 * STEP_S * 1000
    job.hold.refresh_from_db()
    assert job.hold.captured == charge_of(attempt)
    assert ledger.reconcile(record=False) == []


@pytest.mark.django_db(transaction=True)
def test_preempted_run_checkpoints_requeues_and_the_next_attempt_resumes():
    job, attempt = scheduled_job(steps=40)
    thread, result = in_thread(runner.run_attempt, attempt.pk, attempt.fencing_token, worker="w")
    wait_for(lambda: Job.objects.get(pk=job.pk).progress >= 0.1)

    transition(job.pk, to=JobStatus.PREEMPTING, reason="make room", actor="scheduler")
    thread.join(timeout=20)

    (outcome,) = result
    assert outcome.exit_class == ExitClass.PREEMPTED
    assert outcome.exit_code == 143  # the stand-in checkpointed on SIGTERM
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert job.preemption_count == 1
    assert job.checkpoint_ref.startswith("step-")
    done_steps = int(job.checkpoint_ref.removeprefix("step-"))

    second = requeued_attempt(job)
    runner.run_attempt(second.pk, second.fencing_token, worker="w")

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    resumed = JobEvent.objects.get(job=job, to_status=JobStatus.SUCCEEDED).data
    assert resumed["resumed_step"] == done_steps
    attempts = list(job.attempts.order_by("number"))
    job.hold.refresh_from_db()
    assert job.hold.captured == sum(charge_of(a) for a in attempts)
    assert ledger.reconcile(record=False) == []


@pytest.mark.django_db(transaction=True)
def test_a_runner_whose_attempt_was_reaped_kills_its_generator_and_writes_nothing():
    from apps.jobs.services import recovery

    job, attempt = scheduled_job(steps=200)
    thread, result = in_thread(runner.run_attempt, attempt.pk, attempt.fencing_token, worker="w")
    wait_for(lambda: Job.objects.get(pk=job.pk).progress > 0)

    # The beat believes the worker dead (its lease ran out) and reaps the attempt.
    Attempt.objects.filter(pk=attempt.pk).update(lease_expires_at=job.queued_at)
    reaped = recovery.reap_attempt(attempt.pk)
    thread.join(timeout=20)

    assert reaped is not None and reaped.job_status == JobStatus.QUEUED
    (outcome,) = result
    assert outcome.fenced is True
    attempt.refresh_from_db()
    assert attempt.exit_class == ExitClass.LOST  # the runner's finish was refused
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED


@pytest.mark.django_db
def test_params_that_crash_on_two_nodes_are_quarantined_and_the_job_fails():
    job, attempt = scheduled_job(prompt="poison !crash")

    first = runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")
    assert first.job_status == JobStatus.QUEUED  # one node: maybe the node's fault
    second = requeued_attempt(job)  # a fresh node
    runner.run_attempt(second.pk, second.fencing_token, worker="w2")

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_code == "crashed"
    assert "quarantined" in job.error_message
    row = QuarantinedFingerprint.objects.get(pk=job.fingerprint)
    assert row.node_count == 2
    assert row.sample_job_id == job.pk
    assert quarantine.is_quarantined(job.fingerprint)

    assert quarantine.clear_quarantine(job.fingerprint) is True
    assert not quarantine.is_quarantined(job.fingerprint)
    assert quarantine.clear_quarantine(job.fingerprint) is False


@pytest.mark.django_db
def test_failed_nodes_are_reported_for_the_dispatcher_to_avoid():
    job, attempt = scheduled_job(prompt="a fox !crash")
    runner.run_attempt(attempt.pk, attempt.fencing_token, worker="w1")

    assert selectors.nodes_to_avoid([job.pk]) == {job.pk: {attempt.node_id}}
