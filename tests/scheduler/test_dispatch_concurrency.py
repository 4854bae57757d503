"""Two dispatchers at once, on real PostgreSQL with one connection per thread.

Never one job placed twice, never one GPU given to two jobs: the advisory lock makes a
second tick skip, and without the lock the guarded, all-or-nothing application of each
decision lets exactly one of two racing appliers win.
"""

import threading
import uuid

import psycopg
import pytest
from django.db import connection, connections
from django.db.models import Count

from apps.accounts.models import Tier
from apps.core import wakeup
from apps.jobs.models import Attempt, AttemptState, GpuAssignment, Job, JobStatus
from apps.scheduler.models import DecisionOutcome, DispatchDecision
from apps.scheduler.policy import Place, schedule
from apps.scheduler.services import dispatch
from apps.scheduler.services.dispatch import (
    DISPATCH_LOCK_KEY,
    apply_decisions,
    apply_placement,
    run_dispatch_tick,
)
from apps.scheduler.services.snapshot import build_snapshot
from tests.factories import OrgFactory
from tests.scheduler.factories import JobFactory, NodeFactory, dispatch_ticks

pytestmark = pytest.mark.django_db(transaction=True)


def in_threads(*calls):
    """Run the calls at the same instant, each in its own thread (own DB connection)."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)
    errors: list = []

    def run(i, call):
        try:
            barrier.wait(timeout=10)
            results[i] = call()
        except Exception as exc:  # reported below, with the failing thread's error
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def other_session() -> psycopg.Connection:
    """A second PostgreSQL session on the test database (another dispatcher process)."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(autocommit=True, **params)


def assert_no_double_dispatch():
    per_job = (
        Attempt.objects.exclude(state=AttemptState.FINISHED).values("job").annotate(n=Count("id"))
    )
    assert all(row["n"] == 1 for row in per_job)
    per_gpu = (
        GpuAssignment.objects.filter(released_at__isnull=True).values("gpu").annotate(n=Count("id"))
    )
    assert all(row["n"] == 1 for row in per_gpu)
    for attempt in Attempt.objects.exclude(state=AttemptState.FINISHED).select_related("job"):
        gpus = GpuAssignment.objects.filter(attempt=attempt, released_at__isnull=True)
        assert gpus.count() == attempt.job.gpu_count
        assert set(gpus.values_list("gpu__node", flat=True)) == {attempt.node_id}
    scheduled = Job.objects.filter(status=JobStatus.SCHEDULED).count()
    assert scheduled == Attempt.objects.exclude(state=AttemptState.FINISHED).count()


def test_a_tick_is_skipped_while_another_dispatcher_holds_the_lock():
    NodeFactory(gpus=2)
    job = JobFactory()
    with other_session() as other:
        other.execute("SELECT pg_advisory_lock(%s)", [DISPATCH_LOCK_KEY])

        result = run_dispatch_tick()

        assert not result.ran
        assert not Attempt.objects.exists()
        other.execute("SELECT pg_advisory_unlock(%s)", [DISPATCH_LOCK_KEY])  # its tick is done

    result = run_dispatch_tick()
    assert result.ran and result.placed == 1
    assert Job.objects.get(pk=job.pk).status == JobStatus.SCHEDULED


def test_a_tick_skipped_behind_a_running_one_gets_its_round_once_that_one_ends(
    control_queue, monkeypatch
):
    NodeFactory(gpus=2)
    with other_session() as other:
        other.execute("SELECT pg_advisory_lock(%s)", [DISPATCH_LOCK_KEY])
        # The commit that sent this tick came after the running tick read its snapshot.
        assert not run_dispatch_tick().ran
        assert control_queue.exists(wakeup.RERUN_KEY)
        other.execute("SELECT pg_advisory_unlock(%s)", [DISPATCH_LOCK_KEY])

    # The running tick (here this process's next) ends, sees the ask and sends a round.
    read = dispatch.build_snapshot

    def snapshot_while_another_tick_asks():
        snapshot = read()
        wakeup.ask_for_another_round()  # a tick skipped while this one decides
        return snapshot

    monkeypatch.setattr(dispatch, "build_snapshot", snapshot_while_another_tick_asks)
    assert run_dispatch_tick().ran
    assert len(dispatch_ticks(control_queue)) == 1
    assert not control_queue.exists(wakeup.RERUN_KEY)

    # Asks made before a round read its snapshot are answered by that round itself.
    monkeypatch.setattr(dispatch, "build_snapshot", read)
    wakeup.ask_for_another_round()
    assert run_dispatch_tick().ran
    assert len(dispatch_ticks(control_queue)) == 1


def test_a_tick_that_finds_the_running_one_ended_as_it_asked_runs_the_round_itself(
    control_queue, monkeypatch
):
    NodeFactory(gpus=2)
    job = JobFactory()
    with other_session() as other:
        other.execute("SELECT pg_advisory_lock(%s)", [DISPATCH_LOCK_KEY])
        ask = wakeup.ask_for_another_round

        def ask_after_the_running_tick_looked():
            # The running tick took no ask on its way out, then released the lock.
            other.execute("SELECT pg_advisory_unlock(%s)", [DISPATCH_LOCK_KEY])
            ask()

        monkeypatch.setattr(wakeup, "ask_for_another_round", ask_after_the_running_tick_looked)
        result = run_dispatch_tick()

    assert result.ran and result.placed == 1
    assert Job.objects.get(pk=job.pk).status == JobStatus.SCHEDULED
    assert not control_queue.exists(wakeup.RERUN_KEY)  # answered by this round


def test_concurrent_ticks_never_place_a_job_twice_or_share_a_gpu():
    for _ in range(3):
        NodeFactory(gpus=4)
    orgs = [OrgFactory(tier=tier) for tier in (Tier.FREE, Tier.PAID, Tier.ENTERPRISE)]
    for i in range(30):
        JobFactory(org=orgs[i % 3], gpu_count=1 + i % 3)

    def ticks():
        return [run_dispatch_tick() for _ in range(4)]

    rounds = in_threads(ticks, ticks, ticks, ticks)

    results = [result for round_ in rounds for result in round_]
    assert sum(r.placed for r in results) == Attempt.objects.count() > 0
    assert_no_double_dispatch()
    assert GpuAssignment.objects.filter(released_at__isnull=True).count() <= 12


def test_two_appliers_of_the_same_decisions_without_the_lock_place_each_job_once():
    NodeFactory(gpus=4)
    jobs = [JobFactory() for _ in range(4)]
    decisions = schedule(build_snapshot().cluster)  # one snapshot, applied twice at once
    assert len(decisions) == 4

    first, second = in_threads(
        lambda: apply_decisions(decisions, tick=uuid.uuid4()),
        lambda: apply_decisions(decisions, tick=uuid.uuid4()),
    )

    for mine, theirs in zip(first, second, strict=True):
        assert {mine.outcome, theirs.outcome} == {
            DecisionOutcome.APPLIED,
            DecisionOutcome.SKIPPED,
        }
    assert Attempt.objects.count() == 4
    assert set(Attempt.objects.values_list("job", flat=True)) == {j.pk for j in jobs}
    assert DispatchDecision.objects.filter(outcome=DecisionOutcome.SKIPPED).count() == 4
    assert_no_double_dispatch()


def test_two_jobs_racing_for_one_gpu_exactly_one_gets_it_and_nothing_is_half_applied():
    node = NodeFactory(gpus=1)
    gpu = node.gpus.get()
    jobs = [JobFactory(), JobFactory()]
    decisions = [
        Place(job_id=job.pk, node=node.name, gpu_ids=(gpu.pk,), gpu_type="H100", reason="race")
        for job in jobs
    ]

    outcomes = in_threads(*[lambda d=d: apply_placement(d, tick=uuid.uuid4()) for d in decisions])

    assert sorted(o.outcome for o in outcomes) == [
        DecisionOutcome.APPLIED,
        DecisionOutcome.SKIPPED,
    ]
    loser = next(o for o in outcomes if o.outcome == DecisionOutcome.SKIPPED)
    assert "already assigned" in loser.skip_reason
    # The loser left nothing behind: no attempt, no event, still queued.
    assert Attempt.objects.count() == 1
    assert Job.objects.get(pk=loser.job_id).status == JobStatus.QUEUED
    assert Job.objects.get(pk=loser.job_id).attempt_count == 0
    assert_no_double_dispatch()
