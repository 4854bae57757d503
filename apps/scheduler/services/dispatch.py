"""The dispatch tick: snapshot → policy → decisions, applied in guarded transactions.

Only one dispatcher acts at a time: a tick first takes a session-level PostgreSQL
advisory lock with pg_try_advisory_lock and skips if another process holds it (a
crashed dispatcher's session ends, and its lock with it); the skipped tick asks the
running one for another round (apps.core.wakeup), so what woke it is not left for the
periodic tick. Even without the lock, a decision can never be applied twice or half: a
placement locks the job row, moves it queued → scheduled through the guarded state
machine, and inserts GpuAssignment rows that the partial unique index
gpu_one_live_assignment refuses for a GPU already in use; any refusal rolls the whole
decision back and records it as skipped. Placements go in groups of up to
PLACEMENTS_PER_TRANSACTION, with set-based statements (a placement alone was a dozen
statements, most of a tick's time in a burst); a group with any refusal in it is applied
again one placement per transaction, so refusals are what they would be alone.

The run message is published only after the placement has committed (on_commit), so a
worker never sees an attempt that does not exist. If the process dies between commit
and publish, the attempt waits in `scheduled` with a claim lease; the recovery task
(services.recovery.republish_unclaimed_attempts) re-sends its message, and requeues
the job once the lease has run out.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from apps.accounts import selectors as accounts
from apps.core import locks, wakeup
from apps.core.ids import new_id
from apps.core.logging import job_log_context
from apps.fleet.models import Gpu, NodeState, node_queue
from apps.jobs import queue_state
from apps.jobs.models import Attempt, GpuAssignment, Job, JobStatus
from apps.jobs.services.deadlines import PAST_START_DEADLINE
from apps.jobs.services.lifecycle import Move, transition_many
from apps.scheduler.models import DecisionKind, DecisionOutcome, DispatchDecision, NodeClaim
from apps.scheduler.policy import (
    TIERS,
    ClusterSnapshot,
    Decision,
    Place,
    Preempt,
    Reserve,
    Waiting,
    schedule_round,
)
from apps.scheduler.services import metrics
from apps.scheduler.services.decisions import (
    ACTOR,
    SKIPPED_ON,
    AppliedDecision,
    Refused,
    claim_node,
    node_for_share,
    nodes_for_share,
    record_skipped,
    skip_reason,
)
from apps.scheduler.services.preemption import apply_preemption
from apps.scheduler.services.snapshot import build_snapshot
from apps.scheduler.services.usage import fold_ended_attempts

logger = logging.getLogger(__name__)

RUN_ATTEMPT_TASK = "gantry.jobs.run_attempt"
# pg advisory lock key of the dispatcher: the bytes of "gantry:d" as a signed bigint.
DISPATCH_LOCK_KEY = int.from_bytes(b"gantry:d", "big", signed=True)
FENCING_SEQUENCE = "scheduler_fencing_token_seq"


@dataclass
class TickResult:
    ran: bool  # False: another dispatcher held the lock
    queued_loaded: int = 0
    decisions: list[AppliedDecision] = field(default_factory=list)
    deferred: int = 0  # decisions past the apply budget: the next round decides them again

    def count(self, kind: str, outcome: str = DecisionOutcome.APPLIED) -> int:
        return sum(1 for d in self.decisions if d.kind == kind and d.outcome == outcome)

    @property
    def placed(self) -> int:
        return self.count(DecisionKind.PLACE)

    @property
    def preempted(self) -> int:
        return self.count(DecisionKind.PREEMPT)

    @property
    def skipped(self) -> int:
        return sum(1 for d in self.decisions if d.outcome == DecisionOutcome.SKIPPED)


def run_dispatch_tick() -> TickResult:
    """One dispatch round, or nothing if another dispatcher is running one right now.

    Guarantees: at most one tick acts at a time (advisory lock), and a tick that finds
    another running gets a round that starts after it (the running one sends it when it
    ends, unless it has ended already); each decision, or group of placements, is
    applied all-or-nothing in its own transaction, and a placement's run message is
    published only after it committed; every decision, applied or skipped, leaves a
    DispatchDecision row with the policy's reason. Decisions still unapplied when
    GANTRY_DISPATCH_APPLY_BUDGET_S has passed are dropped (no row) and the next round,
    which starts at once, decides them again: any prefix of a round's decisions is
    itself a valid round.
    """
    result = _round_if_free()
    if result is None:
        # Another tick runs, and may have read its snapshot before the commit that sent
        # this one: it is asked for another round when it ends. It may have ended just
        # before the ask: then this one takes the lock.
        wakeup.ask_for_another_round()
        result = _round_if_free()
    if result is None:
        metrics.TICKS.labels("skipped").inc()
        return TickResult(ran=False)
    if wakeup.another_round_asked():
        wakeup.wake_dispatcher_now()
    return result


def _round_if_free() -> TickResult | None:
    """run_dispatch_tick's round under the dispatcher's lock; None if another holds it."""
    started = time.perf_counter()
    with dispatcher_lock() as held:
        if not held:
            return None
        # This round reads after every commit whose tick asked for one until now.
        wakeup.another_round_asked()
        drop_stale_claims()
        fold_ended_attempts()  # fair share sees every attempt that ended before this tick
        read_started = time.perf_counter()
        snapshot = build_snapshot()
        policy_started = time.perf_counter()
        explain = _queue_states_due()
        round_ = schedule_round(snapshot.cluster, explain=explain)
        decisions = round_.decisions
        apply_started = time.perf_counter()
        metrics.POLICY_SECONDS.observe(apply_started - policy_started)
        result = TickResult(ran=True, queued_loaded=snapshot.queued_loaded)
        result.decisions = apply_decisions(
            decisions, tick=new_id(), budget_s=settings.GANTRY_DISPATCH_APPLY_BUDGET_S
        )
        applied = time.perf_counter()
        result.deferred = len(decisions) - len(result.decisions)
        if result.deferred:
            wakeup.ask_for_another_round()  # run_dispatch_tick sends it as this one ends
        if explain:
            publish_queue_states(round_.waiting, snapshot.cluster)
        _report_queue_depth(snapshot, result)
        metrics.report_tick(
            snapshot.cluster,
            [
                decision
                for decision, outcome in zip(
                    decisions[: len(result.decisions)], result.decisions, strict=True
                )
                if isinstance(decision, Place) and outcome.outcome == DecisionOutcome.APPLIED
            ],
        )
    metrics.TICKS.labels("ran").inc()
    ended = time.perf_counter()
    metrics.TICK_SECONDS.observe(ended - started)
    if result.decisions:
        logger.info(
            "dispatch tick: %d placed, %d preempted, %d skipped, %d left to the next round"
            " of %d queued loaded; %.2f s (claims and usage %.2f, read %.2f, policy %.2f,"
            " apply %.2f, queue states and metrics %.2f)",
            result.placed,
            result.preempted,
            result.skipped,
            result.deferred,
            result.queued_loaded,
            ended - started,
            read_started - started,
            policy_started - read_started,
            apply_started - policy_started,
            applied - apply_started,
            ended - applied,
        )
    return result


_queue_states_at = -math.inf  # when this process last published queue states (monotonic)


def _queue_states_due() -> bool:
    """Whether this tick explains the queue: at most every GANTRY_QUEUE_STATE_INTERVAL_S
    (explaining and publishing a long queue costs more than deciding it)."""
    global _queue_states_at
    now = time.monotonic()
    if now - _queue_states_at < settings.GANTRY_QUEUE_STATE_INTERVAL_S:
        return False
    _queue_states_at = now
    return True


def publish_queue_states(waiting: list[Waiting], cluster: ClusterSnapshot) -> int:
    """Tell each waiting job's tenant where it stands (jobs.queue_state): position, why
    it waits and its estimated start; the whole reason is kept for operators. For the
    orgs whose queued jobs the snapshot did not all list, each submitter's window too,
    so that a job further back says what it waits behind."""
    states = (
        (
            str(w.job_id),
            queue_state.QueueState(
                position=w.position,
                reason=w.public_reason,
                estimated_start_at=(
                    datetime.fromtimestamp(w.estimated_start, UTC)
                    if w.estimated_start is not None
                    else None
                ),
                detail=w.reason,
            ),
        )
        for w in waiting
    )
    return queue_state.publish(states, windows=submitter_windows(cluster))


def submitter_windows(
    cluster: ClusterSnapshot,
) -> dict[tuple[str, str], queue_state.SubmitterWindow]:
    """(org, user) -> the jobs of that submitter the snapshot lists, for the submitters
    that may have more: in an org with queued jobs beyond the queue window (the
    snapshot's backlog), those listed as deep as anyone (a submitter with fewer has every
    queued job listed). Jobs with a node claim are listed whatever their depth and are
    not counted."""
    cut = {org for (_tier, org), backlog in cluster.backlog.items() if backlog.jobs}
    listed: dict[tuple[str, str], list[float]] = {}
    for job in cluster.queued:
        if job.claimed_node is None:
            listed.setdefault((job.org, job.user), []).append(job.submitted_at)
    depth = max(map(len, listed.values()), default=0)
    return {
        (org, user): queue_state.SubmitterWindow(looked_at=len(times), newest_at=max(times))
        for (org, user), times in listed.items()
        if org in cut and len(times) >= depth
    }


def _report_queue_depth(snapshot, result: TickResult) -> None:
    """Queued jobs per tier once this tick's placements are out of the queue."""
    tier_of = {job.id: job.tier for job in snapshot.cluster.queued}
    depth = dict.fromkeys(TIERS, 0) | snapshot.queue_depth
    for decision in result.decisions:
        if decision.kind == DecisionKind.PLACE and decision.outcome == DecisionOutcome.APPLIED:
            tier = tier_of.get(decision.job_id)
            if tier in depth:
                depth[tier] = max(0, depth[tier] - 1)
    for tier, count in depth.items():
        metrics.QUEUE_DEPTH.labels(tier).set(count)


def dispatcher_lock():
    """Yield whether this connection holds the dispatcher's advisory lock (never waits)."""
    return locks.try_session_lock(DISPATCH_LOCK_KEY)


def apply_decisions(
    decisions: list[Decision], *, tick: uuid.UUID, budget_s: float | None = None
) -> list[AppliedDecision]:
    """Apply the decisions in the policy's order; a refused one is skipped, not fatal.
    Consecutive placements go together in groups that `_group_size` sizes
    (`apply_placements`); each other decision in its own transaction. With `budget_s`,
    stop before the next step once that long has passed (the first is always applied):
    the outcomes returned are those of a prefix."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    applied: list[AppliedDecision] = []
    seconds_per_placement = None  # as measured by this call's groups
    at = 0
    while at < len(decisions):
        now = time.monotonic()
        if deadline is not None and applied and now >= deadline:
            break
        decision = decisions[at]
        if isinstance(decision, Place):
            size = _group_size(deadline, now, seconds_per_placement)
            run = [decision]
            while (
                len(run) < size
                and at + len(run) < len(decisions)
                and isinstance(decisions[at + len(run)], Place)
            ):
                run.append(decisions[at + len(run)])
            outcomes = apply_placements(run, tick=tick)
            seconds_per_placement = (time.monotonic() - now) / len(run)
        else:
            # Lines about this decision name its job, not the request that woke the tick.
            job_id = decision.for_job_id if isinstance(decision, Preempt) else decision.job_id
            with job_log_context(job_id=job_id, request_id=None):
                if isinstance(decision, Preempt):
                    outcomes = [apply_preemption(decision, tick=tick)]
                elif isinstance(decision, Reserve):
                    outcomes = [apply_reservation(decision, tick=tick)]
                else:  # the policy answers nothing else; refuse loudly rather than guess
                    raise TypeError(f"unknown decision {decision!r}")
        for outcome in outcomes:
            metrics.DECISIONS.labels(outcome.kind, outcome.outcome).inc()
        applied += outcomes
        at += len(outcomes)
    return applied


def _group_size(deadline: float | None, now: float, seconds_per_placement: float | None) -> int:
    """How many placements the next group takes: without a budget,
    PLACEMENTS_PER_TRANSACTION; while the pace is unknown, FIRST_GROUP; at a busy host's
    pace (BUSY_PACE_S or slower), one; else as many as fit in what is left of the budget
    at the last group's pace, at most PLACEMENTS_PER_TRANSACTION."""
    if deadline is None:
        return PLACEMENTS_PER_TRANSACTION
    if seconds_per_placement is None:
        return FIRST_GROUP
    if seconds_per_placement >= BUSY_PACE_S:
        return 1
    fits = int((deadline - now) / max(seconds_per_placement, 1e-6))
    return max(1, min(PLACEMENTS_PER_TRANSACTION, fits))


def apply_placements(decisions: Sequence[Place], *, tick: uuid.UUID) -> list[AppliedDecision]:
    """Apply these placements in one transaction, or, if any of them would be refused,
    each in its own (`apply_placement`): every outcome is the one it would have had
    alone, and a refusal costs only the retry of its group. Together, the group's rows
    are read, locked and written by a few set-based statements instead of a dozen
    statements per placement."""
    if len(decisions) > 1:
        try:
            with transaction.atomic():
                attempts = _place(decisions, tick=tick)
        except SKIPPED_ON as exc:
            logger.info("%d placements applied one by one: %s", len(decisions), skip_reason(exc))
        else:
            return [_applied(d, a) for d, a in zip(decisions, attempts, strict=True)]
    return [apply_placement(decision, tick=tick) for decision in decisions]


def apply_placement(decision: Place, *, tick: uuid.UUID) -> AppliedDecision:
    """Start `decision.job_id` on its GPUs: attempt + assignments + queued → scheduled.

    All or nothing, in one transaction that locks the job row first. Refused (and
    recorded as skipped) when the job is no longer queued or is past its start deadline
    (database clock, under the job's row lock), the node is not active, the GPUs are not
    what the decision says, or any GPU already has a live assignment.
    On commit, publishes `gantry.jobs.run_attempt(attempt_id, fencing_token)` to the
    node's queue.
    """
    with job_log_context(job_id=decision.job_id, request_id=None):
        try:
            with transaction.atomic():
                (attempt,) = _place([decision], tick=tick)
        except SKIPPED_ON as exc:
            return record_skipped(decision, tick=tick, why=skip_reason(exc))
    return _applied(decision, attempt)


def _applied(decision: Place, attempt: Attempt) -> AppliedDecision:
    return AppliedDecision(
        kind=DecisionKind.PLACE,
        outcome=DecisionOutcome.APPLIED,
        job_id=decision.job_id,
        node=decision.node,
        attempt_id=attempt.id,
        fencing_token=attempt.fencing_token,
    )


# Placements that share a transaction. A group pays one lock of its jobs, one read of
# their GPUs and one INSERT or UPDATE per table; a refusal in it sends the whole group
# back one by one. In-process, 602 placements took 10.6-12.5 ms each one at a time, and
# 3.2 / 2.9 / 2.4 ms each in groups of 8 / 16 / 32 (their run messages included): 16,
# because the apply budget is checked between groups, and a group on a host that is
# busy running jobs takes several times as long.
PLACEMENTS_PER_TRANSACTION = 16
# A tick's first group under a budget, while its pace is unknown.
FIRST_GROUP = 4
# A pace of placements that says the host is busy (running the jobs themselves, on a
# small all-in-one host): 2-3 ms a placement in groups and 9 ms alone on an idle 2-core
# host, 100-170 ms on one running hundreds of jobs. There groups did not place more jobs
# a second (7.0-8.2 against 6.2-7.7, the host's CPU is the limit) and started them in
# bunches that slowed the next rounds: enterprise jobs submitted during a 400-job burst
# waited up to 9.0-14.6 s in six runs, against 5.1-7.2 s one at a time. So one at a time.
BUSY_PACE_S = 0.02

_GPU_COLUMNS = (
    "id",
    "node_id",
    "index",
    "gpu_type_id",
    "device_id",
    "gpu_type__memory_gb",
    "gpu_type__price_per_gpu_hour",
)


def _place(decisions: Sequence[Place], *, tick: uuid.UUID) -> list[Attempt]:
    """Place every decision or raise (Refused, or what the database refuses): the jobs
    locked in primary-key order, then their nodes FOR SHARE, every check of
    `_check_placement`, then attempts, GPU assignments, the jobs' transitions and the
    decisions' records written for all of them at once."""
    jobs = {
        str(job.pk): job
        for job in Job.objects.select_for_update()
        .filter(pk__in=[d.job_id for d in decisions])
        .order_by("pk")
        .only(
            "id", "org_id", "status", "attempt_count", "gpu_count", "gpu_types", "min_gpu_memory_gb"
        )
        # Read with the row lock, by the database clock: the snapshot left out jobs past
        # their start deadline, but one may have passed it since; it must not start.
        .annotate(past_start_deadline=PAST_START_DEADLINE)
    }
    nodes = nodes_for_share(d.node for d in decisions)
    gpus = {
        row[0]: row
        for row in Gpu.objects.filter(pk__in={g for d in decisions for g in d.gpu_ids})
        .order_by("node_id", "index")
        .values_list(*_GPU_COLUMNS)
    }
    placed = [_check_placement(d, jobs=jobs, nodes=nodes, gpus=gpus) for d in decisions]
    with connection.cursor() as cursor:
        # synchronous_commit off for this transaction only: if PostgreSQL crashed and lost
        # the commit, the jobs are still queued (placed again) and the run messages find no
        # attempt to claim; placements are the tick's hot path and skip the fsync wait.
        cursor.execute(
            "SELECT now(), array(SELECT nextval(%s) FROM generate_series(1, %s)),"
            " set_config('synchronous_commit', 'off', true)",
            [FENCING_SEQUENCE, len(decisions)],
        )
        db_now, tokens, _ = cursor.fetchone()
    lease_expires_at = db_now + timedelta(seconds=settings.GANTRY_SCHEDULING_LEASE_S)
    attempts = Attempt.objects.bulk_create(
        Attempt(
            job_id=job.id,
            org_id=job.org_id,
            number=job.attempt_count + 1,
            node_id=node_id,
            gpu_type=decision.gpu_type,
            price_per_gpu_hour=held[0][6],  # the job pays this type's price, fixed now
            gpu_indices=[gpu[2] for gpu in held],
            devices=",".join(gpu[4] or str(gpu[2]) for gpu in held),
            fencing_token=token,
            lease_expires_at=lease_expires_at,
        )
        for (decision, job, node_id, held), token in zip(placed, tokens, strict=True)
    )
    # The partial unique index refuses a GPU that is still live elsewhere: IntegrityError.
    GpuAssignment.objects.bulk_create(
        GpuAssignment(attempt=attempt, gpu_id=gpu[0])
        for attempt, (_decision, _job, _node_id, held) in zip(attempts, placed, strict=True)
        for gpu in held
    )
    moves = []
    for attempt, (decision, job, _node_id, _held) in zip(attempts, placed, strict=True):
        where = (
            f"{decision.node} GPU {','.join(map(str, attempt.gpu_indices))} ({decision.gpu_type})"
        )
        moves.append(
            Move(
                job_id=job.id,
                reason=f"placed on {where}: {decision.reason}",
                public_reason=f"placed on {where}",  # the policy's reason carries scores
                attempt=attempt,
                changes={
                    "attempt_count": F("attempt_count") + 1,
                    "gpu_type": decision.gpu_type,
                    "not_before": None,
                },
                data={
                    "attempt": str(attempt.id),
                    "node": decision.node,
                    "gpu_indices": attempt.gpu_indices,
                    "gpu_type": decision.gpu_type,
                    "price_per_gpu_hour": attempt.price_per_gpu_hour,
                },
            )
        )
    transition_many(moves, to=JobStatus.SCHEDULED, only_from=[JobStatus.QUEUED], actor=ACTOR)
    NodeClaim.objects.filter(job_id__in=list(jobs)).delete()
    DispatchDecision.objects.bulk_create(
        DispatchDecision(
            tick=tick,
            kind=DecisionKind.PLACE,
            outcome=DecisionOutcome.APPLIED,
            job_id=attempt.job_id,
            node_name=decision.node,
            gpu_type=decision.gpu_type,
            gpu_indices=attempt.gpu_indices,
            attempt=attempt,
            reason=decision.reason,
        )
        for attempt, (decision, *_rest) in zip(attempts, placed, strict=True)
    )
    names = accounts.org_names({job.org_id for job in jobs.values()})
    for attempt, (decision, job, *_rest) in zip(attempts, placed, strict=True):
        transaction.on_commit(
            functools.partial(
                publish_run_attempt,
                attempt_id=attempt.id,
                fencing_token=attempt.fencing_token,
                node_name=decision.node,
                job_id=job.id,
                org_name=names.get(str(job.org_id), ""),  # for Flower: the work named
            ),
            robust=True,
        )
    return attempts


def _check_placement(
    decision: Place, *, jobs: dict[str, Job], nodes: dict, gpus: dict[int, tuple]
) -> tuple[Place, Job, int, list[tuple]]:
    """(decision, its locked job, its node's id, its GPUs' rows), or Refused."""
    job = jobs.get(str(decision.job_id))
    if job is None:
        raise Job.DoesNotExist(f"Job {decision.job_id} does not exist.")
    if job.status != JobStatus.QUEUED:
        raise Refused(f"job {job.id} is {job.status}, no longer queued")
    if job.past_start_deadline:
        raise Refused(f"job {job.id} is past its start deadline")
    if len(decision.gpu_ids) != job.gpu_count:
        raise Refused(f"job {job.id} needs {job.gpu_count} GPUs, got {len(decision.gpu_ids)}")
    node_id, node_state = nodes[decision.node]
    if node_state != NodeState.ACTIVE:
        raise Refused(f"node {decision.node} is {node_state}")
    held = sorted(
        (gpus[g] for g in set(decision.gpu_ids) if g in gpus and gpus[g][1] == node_id),
        key=lambda gpu: gpu[2],
    )
    if len(held) != len(decision.gpu_ids) or any(g[3] != decision.gpu_type for g in held):
        raise Refused(f"GPUs {decision.gpu_ids} are not {decision.gpu_type} on {decision.node}")
    if job.gpu_types and decision.gpu_type not in job.gpu_types:
        raise Refused(f"job {job.id} does not allow {decision.gpu_type}")
    if held[0][5] < job.min_gpu_memory_gb:
        raise Refused(f"{decision.gpu_type} has {held[0][5]} GB, job {job.id} needs more")
    return decision, job, node_id, held


def apply_reservation(decision: Reserve, *, tick: uuid.UUID) -> AppliedDecision:
    """Record `decision.node` as the node drained for a blocked multi-GPU job.

    The claim (NodeClaim, kind reserve) makes later rounds keep draining the same node
    until the job starts there. A round repeating the same reservation changes nothing
    and writes nothing (the audit trail gets one row per new or moved reservation).
    Refused when the job is no longer queued or the node is not active."""
    try:
        with transaction.atomic():
            job = Job.objects.select_for_update().only("id", "status").get(pk=decision.job_id)
            if job.status != JobStatus.QUEUED:
                raise Refused(f"job {job.id} is {job.status}, no longer queued")
            node_id, node_state = node_for_share(decision.node)
            if node_state != NodeState.ACTIVE:
                raise Refused(f"node {decision.node} is {node_state}")
            current = NodeClaim.objects.filter(job_id=job.id).values_list("node_id", flat=True)
            if node_id not in current:
                record = DispatchDecision.objects.create(
                    tick=tick,
                    kind=DecisionKind.RESERVE,
                    outcome=DecisionOutcome.APPLIED,
                    job_id=job.id,
                    node_name=decision.node,
                    gpu_type=decision.gpu_type,
                    reason=decision.reason,
                )
                claim_node(job_id=job.id, node_id=node_id, kind=DecisionKind.RESERVE, record=record)
    except SKIPPED_ON as exc:
        return record_skipped(decision, tick=tick, why=skip_reason(exc))
    return AppliedDecision(
        kind=DecisionKind.RESERVE,
        outcome=DecisionOutcome.APPLIED,
        job_id=decision.job_id,
        node=decision.node,
    )


def publish_run_attempt(
    *, attempt_id, fencing_token: int, node_name: str, job_id=None, org_name: str = ""
) -> bool:
    """Send the run task to the node's worker pool; False (logged) if the broker refused.
    `job_id` and `org_name` travel as keyword arguments for whoever watches the queues
    (Flower shows them); the task needs only the attempt and its token.

    A lost message is not a lost job: the attempt stays scheduled until its worker
    claims it, and the recovery task re-sends the message or requeues the job."""
    try:
        current_app.send_task(
            RUN_ATTEMPT_TASK,
            args=[str(attempt_id), fencing_token],
            kwargs={"job": str(job_id), "org": org_name} if job_id else {},
            queue=node_queue(node_name),
        )
    except Exception as exc:  # broker errors vary by transport; recovery covers them all
        logger.warning("run message for attempt %s not sent: %s", attempt_id, exc)
        return False
    return True


def drop_stale_claims() -> int:
    """Forget preemption claims whose job left the queue or that outlived their TTL."""
    ttl = timedelta(seconds=settings.GANTRY_NODE_CLAIM_TTL_S)
    deleted, _ = NodeClaim.objects.filter(
        ~Q(job__status=JobStatus.QUEUED) | Q(created_at__lt=Now() - ttl)
    ).delete()
    return deleted
