"""Fault injection against real workers: kill -9, duplicate messages, a flushed Redis, a
beat killed mid-tick, a worker clock hours off. After each, the ledger reconciles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import psycopg
import pytest
import redis
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.jobs.models import Attempt, AttemptState, ExitClass, Job, JobEvent, JobStatus
from apps.jobs.services import attempts, recovery
from apps.ledger import services as ledger
from apps.scheduler.services.dispatch import publish_run_attempt
from tests.jobs.factories import JobFactory, funded_org, place
from tests.ledger.assertions import assert_ledger_exact, charge_of
from tests.worker_harness import (
    E2E_FLEET,
    ROOT,
    Beat,
    free_port,
    pool_fixture,
    skewed_clock_env,
    submit_job,
    worker_database_url,
    worker_env,
)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

workers = pool_fixture("e2e-h100", "e2e-a100")

# The e2e fleet plus two single-GPU nodes that start without a worker.
FAULT_FLEET = {
    "gpu_types": {**E2E_FLEET["gpu_types"], "L4": {"memory_gb": 24, "price_per_gpu_hour": 900_000}},
    "nodes": [
        *E2E_FLEET["nodes"],
        {"name": "e2e-late", "gpus": [{"type": "L4"}]},
    ],
}


@pytest.fixture
def beat(workers, settings):
    beat = Beat.over(workers, settings, fleet=FAULT_FLEET)
    yield beat
    beat.drain(timeout=20)
    workers.stop_node("e2e-late")  # started by a test, with its own settings


def finished(job) -> bool:
    return Job.objects.get(pk=job.pk).is_terminal


def live_attempts(job) -> int:
    return Attempt.objects.filter(job=job).exclude(state=AttemptState.FINISHED).count()


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def test_a_killed_worker_s_job_is_requeued_after_its_lease_and_resumes_elsewhere(beat, workers):
    org = funded_org()
    job = submit_job(
        org, prompt="a fox crossing", steps=60, step_seconds=0.05, gpu_types=("H100", "A100")
    )
    beat.until(
        lambda: (
            Job.objects.get(pk=job.pk).progress >= 0.2
            and bool(Job.objects.get(pk=job.pk).checkpoint_ref)
        ),
        timeout=30,
    )
    first = Attempt.objects.get(job=job)
    victim = next(w for w in workers.workers if w.node == first.node.name and w.alive)

    victim.kill9()
    # The generator dies with its worker (parent-death signal), as on a dead node.
    wait = time.monotonic() + 5
    while processes_mentioning(str(first.pk)) and time.monotonic() < wait:
        time.sleep(0.05)
    assert processes_mentioning(str(first.pk)) == []
    restarted = workers.launch(victim.node)  # the node's supervisor brings a new worker up

    most_live = 0

    def done():
        nonlocal most_live
        most_live = max(most_live, live_attempts(job))
        return finished(job)

    beat.until(done, timeout=45)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, workers.logs()
    assert most_live <= 1  # never two live attempts, hence never two runs at once
    lost, second = job.attempts.order_by("number")
    assert lost.exit_class == ExitClass.LOST
    assert second.exit_class == ExitClass.SUCCEEDED
    assert second.started_at >= lost.finished_at
    resumed = JobEvent.objects.get(job=job, to_status=JobStatus.SUCCEEDED).data["resumed_step"]
    assert resumed >= 12  # at least the 20 % it had checkpointed before the kill

    # Late writes of the dead attempt (a zombie runner) are fenced off.
    before = (lost.gpu_ms, lost.charged, job.hold.captured)
    assert attempts.heartbeat(lost, gpu_ms=10**9, charged=10**9, seq=10**6) is None
    with pytest.raises(attempts.Fenced):
        attempts.finish_attempt(
            lost, attempts.Finish(ExitClass.SUCCEEDED, 0, gpu_ms=10**9, charged=10**9), worker="z"
        )
    lost.refresh_from_db()
    job.refresh_from_db()
    assert (lost.gpu_ms, lost.charged, job.hold.captured) == before
    assert job.status == JobStatus.SUCCEEDED
    assert_ledger_exact(job)
    restarted.wait_ready()


def test_a_killed_worker_restarted_under_its_name_requeues_its_job_before_the_lease_ends(
    beat, workers
):
    org = funded_org()
    job = submit_job(
        org, prompt="a fox restarted", steps=60, step_seconds=0.05, gpu_types=("H100", "A100")
    )
    beat.until(lambda: bool(Job.objects.get(pk=job.pk).checkpoint_ref), timeout=30)
    first = Attempt.objects.get(job=job)
    victim = next(w for w in workers.workers if w.node == first.node.name and w.alive)

    victim.kill9()
    killed_at = time.monotonic()
    # The node's supervisor brings the worker back under the same Celery name; no
    # reaper runs meanwhile (this beat ticks only in `until`), so only the restart can
    # have ended the attempt.
    restarted = workers.launch(victim.node, hostname=victim.hostname).wait_ready()
    first.refresh_from_db()
    assert first.state == AttemptState.FINISHED  # ended before the worker took a message
    assert first.exit_class == ExitClass.LOST
    assert first.error_message == recovery.RESTARTED_MESSAGE
    print(
        f"attempt ended {time.monotonic() - killed_at:.1f} s after the kill (lease: "
        f"{settings.GANTRY_LEASE_S:g} s from the last heartbeat)"
    )

    beat.until(lambda: finished(job), timeout=45)
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, workers.logs()
    lost, second = job.attempts.order_by("number")
    assert (lost.pk, second.exit_class) == (first.pk, ExitClass.SUCCEEDED)
    assert JobEvent.objects.get(job=job, to_status=JobStatus.SUCCEEDED).data["resumed_step"] > 0
    assert_ledger_exact(job)
    assert restarted.alive


def test_a_worker_starting_while_its_database_is_down_comes_up_and_leaves_it_to_the_leases(
    workers,
):
    unreachable = f"postgres://postgres@127.0.0.1:{free_port()}/gantry"
    worker = workers.launch("e2e-nodb", slots=1, extra_env={"DATABASE_URL": unreachable})
    try:
        worker.wait_ready(timeout=60)
        assert "could not look for attempts of" in worker.log()
        assert worker.alive
    finally:
        workers.stop_node("e2e-nodb")


def test_a_worker_told_to_stop_hands_its_job_back_with_its_checkpoint(beat, workers):
    late = workers.start("e2e-late", slots=1)
    org = funded_org()
    job = submit_job(org, prompt="a fox at night", steps=100, step_seconds=0.05, gpu_types=("L4",))
    beat.until(lambda: Job.objects.get(pk=job.pk).progress >= 0.1, timeout=30)

    late.proc.send_signal(signal.SIGTERM)  # warm shutdown, as on a deploy or Ctrl-C
    assert late.proc.wait(timeout=20) == 0

    job.refresh_from_db()
    (attempt,) = job.attempts.all()
    assert attempt.exit_class == ExitClass.PREEMPTED  # handed back, not lost to the lease
    assert attempt.exit_code == 143  # the generator checkpointed on SIGTERM
    assert job.status == JobStatus.QUEUED
    assert job.checkpoint_ref.startswith("step-")
    assert job.preemption_count == 0
    assert job.hold.usage == attempt.charged == charge_of(attempt)
    assert ledger.reconcile(record=False) == []


def test_the_same_run_message_delivered_twice_runs_once(beat, workers):
    org = funded_org()
    job = submit_job(org, prompt="a fox twice", steps=10, step_seconds=0.05)
    beat.until(lambda: Attempt.objects.filter(job=job).exists(), timeout=20)
    attempt = Attempt.objects.get(job=job)
    worker = next(w for w in workers.workers if w.node == attempt.node.name and w.alive)
    refusals = worker.log().count("'not claimed'")

    for _ in range(2):
        publish_run_attempt(
            attempt_id=attempt.pk, fencing_token=attempt.fencing_token, node_name="e2e-h100"
        )
    beat.until(
        lambda: finished(job) and worker.log().count("'not claimed'") >= refusals + 2,
        timeout=30,
    )

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.attempts.count() == 1
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.RUNNING).count() == 1
    assert_ledger_exact(job)


def test_flushing_redis_mid_run_loses_neither_the_job_nor_a_credit(beat, workers):
    org = funded_org()
    job = submit_job(org, prompt="a fox in a storm", steps=40, step_seconds=0.05)
    beat.until(lambda: Job.objects.get(pk=job.pk).progress >= 0.2, timeout=30)
    beat.tick()  # some heartbeat usage folded into the ledger, the rest pending in Redis

    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    beat.until(lambda: finished(job), timeout=30)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, workers.logs()
    assert job.attempts.count() == 1
    assert_ledger_exact(job)


def test_the_brokers_connections_dropped_mid_run_leave_the_run_running(beat, workers):
    """A broker restart or failover drops every client's connection. Before: the GPU
    worker then tried to cancel its running tasks (the threads pool cannot: "does not
    implement kill_job"), died of it, and its restart ended the run; with Celery 5.7.0 it
    died of an AttributeError instead. The run's fate is its lease, not the broker."""
    org = funded_org()
    job = submit_job(org, prompt="a fox in the wind", steps=40, step_seconds=0.1)
    beat.until(lambda: Job.objects.get(pk=job.pk).progress >= 0.2, timeout=30)
    attempt = Attempt.objects.get(job=job)
    worker = next(w for w in workers.workers if w.node == attempt.node.name and w.alive)

    dropped = redis.Redis.from_url(settings.REDIS_URL).client_kill_filter(
        _type="normal", skipme=True
    )
    assert dropped >= 1
    beat.until(lambda: finished(job), timeout=30)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, worker.log()[-3000:]
    assert job.attempts.count() == 1
    assert worker.alive and "Unrecoverable error" not in worker.log(), worker.log()[-3000:]
    assert_ledger_exact(job)


def test_a_run_message_lost_in_a_redis_flush_is_sent_again(beat, workers):
    org = funded_org()
    job = submit_job(org, prompt="a late fox", steps=4, step_seconds=0.05, gpu_types=("L4",))
    beat.until(lambda: Attempt.objects.filter(job=job).exists(), timeout=20)

    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # the queued message is gone
    workers.start("e2e-late", slots=1)
    beat.until(lambda: finished(job), timeout=30)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, workers.logs()
    assert job.attempts.count() == 1
    assert_ledger_exact(job)


# --------------------------------------------------------------------------- the beat


BEAT_SCRIPT = """
import django
django.setup()
from apps.jobs.services import recovery
from apps.scheduler.services.dispatch import run_dispatch_tick
{call}
"""


def start_beat_process(call: str, workers) -> subprocess.Popen:
    env = worker_env(workers.media_root, workers.scratch_root)
    return subprocess.Popen(
        [sys.executable, "-c", BEAT_SCRIPT.format(call=call)], cwd=ROOT, env=env
    )


class RowLock:
    """Hold FOR UPDATE on one job row from another connection until released."""

    def __init__(self, job_id):
        self.conn = psycopg.connect(worker_database_url(), autocommit=False)
        self.conn.execute("SELECT 1 FROM jobs_job WHERE id = %s FOR UPDATE", [job_id])

    def has_waiter(self) -> bool:
        with psycopg.connect(worker_database_url()) as probe:
            row = probe.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database()"
            ).fetchone()
        return row[0] > 0

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


def reap_in_thread() -> None:
    from apps.jobs.services import recovery

    try:
        recovery.reap_expired_leases()
    finally:
        connection.close()


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_reaper_killed_mid_tick_leaves_each_job_whole_and_a_rerun_finishes(beat, workers):
    now = timezone.now()
    jobs = []
    for i in range(6):  # six running jobs whose workers are gone, oldest lease first
        job = JobFactory(status=JobStatus.RUNNING, with_hold=True)
        attempt = place(job, state=AttemptState.RUNNING, started=True)
        Attempt.objects.filter(pk=attempt.pk).update(
            lease_expires_at=now - timedelta(seconds=60 - i), charged=100 + i, gpu_ms=1000
        )
        jobs.append(job)
    lock = RowLock(jobs[3].pk)
    reaper = start_beat_process("recovery.reap_expired_leases()", workers)
    try:
        wait_until(lambda: lock.has_waiter() and Job.objects.filter(status="queued").count() == 3)
        reaper.send_signal(signal.SIGKILL)  # the beat dies in the middle of its tick
        reaper.wait(timeout=10)
    finally:
        lock.release()

    for job in jobs:  # each job is either fully reaped or untouched, never half
        job.refresh_from_db()
        attempt = job.attempts.get()
        if job.status == JobStatus.QUEUED:
            assert attempt.exit_class == ExitClass.LOST
            assert not attempt.assignments.filter(released_at__isnull=True).exists()
            assert job.hold.usage == attempt.charged
        else:
            assert (job.status, attempt.state) == (JobStatus.RUNNING, AttemptState.RUNNING)
            assert attempt.assignments.filter(released_at__isnull=True).exists()
    assert [j.status for j in jobs] == ["queued"] * 3 + ["running"] * 3

    # A restarted beat runs the tick again, twice at once even: the rest is reaped once.
    reapers = [threading.Thread(target=reap_in_thread) for _ in range(2)]
    for thread in reapers:
        thread.start()
    for thread in reapers:
        thread.join(timeout=30)

    for job in jobs:
        assert (
            JobEvent.objects.filter(job=job, from_status="running", to_status="queued").count() == 1
        )
    assert ledger.reconcile(record=False) == []


def test_a_dispatcher_killed_mid_tick_places_nothing_twice(beat, workers):
    org = funded_org()
    jobs = [
        submit_job(org, prompt=f"a fox {i}", steps=2, step_seconds=0.05, gpu_types=("H100", "A100"))
        for i in range(3)
    ]
    lock = RowLock(jobs[1].pk)
    dispatcher = start_beat_process("run_dispatch_tick()", workers)
    try:
        wait_until(lock.has_waiter)
        dispatcher.send_signal(signal.SIGKILL)
        dispatcher.wait(timeout=10)
    finally:
        lock.release()
    assert Job.objects.get(pk=jobs[1].pk).status == JobStatus.QUEUED
    assert not Attempt.objects.filter(job=jobs[1]).exists()  # its transaction rolled back

    beat.until(lambda: all(finished(j) for j in jobs), timeout=30)

    for job in jobs:
        job.refresh_from_db()
        assert job.status == JobStatus.SUCCEEDED
        assert job.attempts.count() == 1
        assert JobEvent.objects.filter(job=job, to_status=JobStatus.SCHEDULED).count() == 1
        assert_ledger_exact(job)


# --------------------------------------------------------------------------- clocks


def test_a_worker_whose_clock_is_six_hours_behind_charges_exactly_the_time_used(beat, workers):
    skew = skewed_clock_env("-6h")
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **skew},
        capture_output=True,
        text=True,
        check=True,
    )
    assert time.time() - float(probe.stdout) > 5 * 3600  # the harness really skews it
    workers.start("e2e-late", slots=1, extra_env=skew)
    org = funded_org()
    steps, step_seconds = 20, 0.05
    job = submit_job(
        org, prompt="a fox at dusk", steps=steps, step_seconds=step_seconds, gpu_types=("L4",)
    )

    beat.until(lambda: finished(job), timeout=30)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, workers.logs()
    (attempt,) = job.attempts.all()  # its lease held: leases use the database clock
    assert steps * step_seconds * 1000 <= attempt.gpu_ms < 60_000
    assert_ledger_exact(job)
