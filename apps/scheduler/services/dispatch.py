"""The dispatch tick: snapshot → policy → decisions, each applied in its own transaction.

Only one dispatcher acts at a time: a tick first takes a session-level PostgreSQL
advisory lock with pg_try_advisory_lock and skips if another process holds it (a
crashed dispatcher's session ends, and its lock with it); the skipped tick asks the
running one for another round (apps.core.wakeup), so what woke it is not left for the
periodic tick. Even without the lock, a decision can never be applied twice or half: a
placement locks the job row, moves it queued → scheduled through the guarded state
machine, and inserts GpuAssignment rows that the partial unique index
gpu_one_live_assignment refuses for a GPU already in use; any refusal rolls the whole
decision back and records it as skipped.

The run message is published only after the placement has committed (on_commit), so a
worker never sees an attempt that does not exist. If the process dies between commit
and publish, the attempt waits in `scheduled` with a claim lease; the recovery task
(services.recovery.republish_unclaimed_attempts) re-sends its message, and requeues
the job once the lease has run out.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from apps.accounts import selectors as accounts
from apps.core import locks, wakeup
from apps.core.logging import job_log_context
from apps.fleet.models import Gpu, NodeState, node_queue
from apps.jobs import queue_state
from apps.jobs.models import Attempt, GpuAssignment, Job, JobStatus
from apps.jobs.services.deadlines import PAST_START_DEADLINE
from apps.jobs.services.lifecycle import transition
from apps.scheduler.models import DecisionKind, DecisionOutcome, DispatchDecision, NodeClaim
from apps.scheduler.policy import TIERS, Decision, Place, Preempt, Reserve, Waiting, schedule_round
from apps.scheduler.services import metrics
from apps.scheduler.services.decisions import (
    ACTOR,
    SKIPPED_ON,
    AppliedDecision,
    Refused,
    claim_node,
    node_for_share,
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
    ends, unless it has ended already); each decision is applied all-or-nothing in its
    own transaction, and a placement's run message is published only after it
    committed; every decision, applied or skipped, leaves a DispatchDecision row with
    the policy's reason. Decisions still unapplied when GANTRY_DISPATCH_APPLY_BUDGET_S
    has passed are dropped (no row) and the next round, which starts at once, decides
    them again: any prefix of a round's decisions is itself a valid round.
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
        snapshot = build_snapshot()
        policy_started = time.perf_counter()
        explain = _queue_states_due()
        round_ = schedule_round(snapshot.cluster, explain=explain)
        decisions = round_.decisions
        metrics.POLICY_SECONDS.observe(time.perf_counter() - policy_started)
        result = TickResult(ran=True, queued_loaded=snapshot.queued_loaded)
        result.decisions = apply_decisions(
            decisions, tick=uuid.uuid4(), budget_s=settings.GANTRY_DISPATCH_APPLY_BUDGET_S
        )
        result.deferred = len(decisions) - len(result.decisions)
        if result.deferred:
            wakeup.ask_for_another_round()  # run_dispatch_tick sends it as this one ends
        if explain:
            publish_queue_states(round_.waiting)
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
    metrics.TICK_SECONDS.observe(time.perf_counter() - started)
    if result.decisions:
        logger.info(
            "dispatch tick: %d placed, %d preempted, %d skipped, %d left to the next round"
            " of %d queued loaded",
            result.placed,
            result.preempted,
            result.skipped,
            result.deferred,
            result.queued_loaded,
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


def publish_queue_states(waiting: list[Waiting]) -> int:
    """Tell each waiting job's tenant where it stands (jobs.queue_state): position, why
    it waits and its estimated start; the whole reason is kept for operators."""
    return queue_state.publish(
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
    """Apply each decision in its own transaction, in the policy's order; a refused one is
    skipped, not fatal. With `budget_s`, stop before the next decision once that long has
    passed (the first is always applied): the outcomes returned are those of a prefix."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    applied = []
    for decision in decisions:
        if deadline is not None and applied and time.monotonic() >= deadline:
            break
        # Lines about this decision name its job, not the request that woke the tick.
        job_id = decision.for_job_id if isinstance(decision, Preempt) else decision.job_id
        with job_log_context(job_id=job_id, request_id=None):
            if isinstance(decision, Place):
                outcome = apply_placement(decision, tick=tick)
            elif isinstance(decision, Preempt):
                outcome = apply_preemption(decision, tick=tick)
            elif isinstance(decision, Reserve):
                outcome = apply_reservation(decision, tick=tick)
            else:  # the policy answers nothing else; refuse loudly rather than guess
                raise TypeError(f"unknown decision {decision!r}")
        metrics.DECISIONS.labels(outcome.kind, outcome.outcome).inc()
        applied.append(outcome)
    return applied


def apply_placement(decision: Place, *, tick: uuid.UUID) -> AppliedDecision:
    """Start `decision.job_id` on its GPUs: attempt + assignments + queued → scheduled.

    All or nothing, in one transaction that locks the job row first. Refused (and
    recorded as skipped) when the job is no longer queued or is past its start deadline
    (database clock, under the job's row lock), the node is not active, the GPUs are not
    what the decision says, or any GPU already has a live assignment.
    On commit, publishes `gantry.jobs.run_attempt(attempt_id, fencing_token)` to the
    node's queue.
    """
    try:
        with transaction.atomic():
            attempt = _place(decision, tick=tick)
    except SKIPPED_ON as exc:
        return record_skipped(decision, tick=tick, why=skip_reason(exc))
    return AppliedDecision(
        kind=DecisionKind.PLACE,
        outcome=DecisionOutcome.APPLIED,
        job_id=decision.job_id,
        node=decision.node,
        attempt_id=attempt.id,
        fencing_token=attempt.fencing_token,
    )


def _place(decision: Place, *, tick: uuid.UUID) -> Attempt:
    job = (
        Job.objects.select_for_update()
        .only(
            "id", "org_id", "status", "attempt_count", "gpu_count", "gpu_types", "min_gpu_memory_gb"
        )
        # Read with the row lock, by the database clock: the snapshot left out jobs past
        # their start deadline, but one may have passed it since; it must not start.
        .annotate(past_start_deadline=PAST_START_DEADLINE)
        .get(pk=decision.job_id)
    )
    if job.status != JobStatus.QUEUED:
        raise Refused(f"job {job.id} is {job.status}, no longer queued")
    if job.past_start_deadline:
        raise Refused(f"job {job.id} is past its start deadline")
    if len(decision.gpu_ids) != job.gpu_count:
        raise Refused(f"job {job.id} needs {job.gpu_count} GPUs, got {len(decision.gpu_ids)}")
    node_id, node_state = node_for_share(decision.node)
    if node_state != NodeState.ACTIVE:
        raise Refused(f"node {decision.node} is {node_state}")
    gpus = list(
        Gpu.objects.filter(node_id=node_id, pk__in=decision.gpu_ids)
        .order_by("index")
        .values_list(
            "id",
            "index",
            "gpu_type_id",
            "device_id",
            "gpu_type__memory_gb",
            "gpu_type__price_per_gpu_hour",
        )
    )
    if len(gpus) != len(set(decision.gpu_ids)) or any(g[2] != decision.gpu_type for g in gpus):
        raise Refused(f"GPUs {decision.gpu_ids} are not {decision.gpu_type} on {decision.node}")
    if job.gpu_types and decision.gpu_type not in job.gpu_types:
        raise Refused(f"job {job.id} does not allow {decision.gpu_type}")
    memory_gb, price = gpus[0][4], gpus[0][5]  # the job pays this type's price, fixed now
    if memory_gb < job.min_gpu_memory_gb:
        raise Refused(f"{decision.gpu_type} has {memory_gb} GB, job {job.id} needs more")
    with connection.cursor() as cursor:
        # synchronous_commit off for this transaction only: if PostgreSQL crashed and lost
        # the commit, the job is still queued (placed again) and the run message finds no
        # attempt to claim; placements are the tick's hot path and skip the fsync wait.
        cursor.execute(
            "SELECT now(), nextval(%s), set_config('synchronous_commit', 'off', true)",
            [FENCING_SEQUENCE],
        )
        db_now, token, _ = cursor.fetchone()
    indices = [gpu[1] for gpu in gpus]
    devices = ",".join(gpu[3] or str(gpu[1]) for gpu in gpus)
    attempt = Attempt.objects.create(
        job_id=job.id,
        org_id=job.org_id,
        number=job.attempt_count + 1,
        node_id=node_id,
        gpu_type=decision.gpu_type,
        price_per_gpu_hour=price,
        gpu_indices=indices,
        devices=devices,
        fencing_token=token,
        lease_expires_at=db_now + timedelta(seconds=settings.GANTRY_SCHEDULING_LEASE_S),
    )
    # The partial unique index refuses a GPU that is still live elsewhere: IntegrityError.
    GpuAssignment.objects.bulk_create(GpuAssignment(attempt=attempt, gpu_id=gpu[0]) for gpu in gpus)
    where = f"{decision.node} GPU {','.join(map(str, indices))} ({decision.gpu_type})"
    transition(
        job.id,
        to=JobStatus.SCHEDULED,
        only_from=[JobStatus.QUEUED],
        reason=f"placed on {where}: {decision.reason}",
        public_reason=f"placed on {where}",  # the policy's reason carries fair-share scores
        actor=ACTOR,
        attempt=attempt,
        changes={
            "attempt_count": F("attempt_count") + 1,
            "gpu_type": decision.gpu_type,
            "not_before": None,
        },
        data={
            "attempt": str(attempt.id),
            "node": decision.node,
            "gpu_indices": indices,
            "gpu_type": decision.gpu_type,
            "price_per_gpu_hour": price,
        },
    )
    NodeClaim.objects.filter(job_id=job.id).delete()
    DispatchDecision.objects.create(
        tick=tick,
        kind=DecisionKind.PLACE,
        outcome=DecisionOutcome.APPLIED,
        job_id=job.id,
        node_name=decision.node,
        gpu_type=decision.gpu_type,
        gpu_indices=indices,
        attempt=attempt,
        reason=decision.reason,
    )
    attempt_id, node_name = attempt.id, decision.node
    org_name = accounts.org_name(job.org_id)  # for Flower: the work named, not only ids
    transaction.on_commit(
        lambda: publish_run_attempt(
            attempt_id=attempt_id,
            fencing_token=token,
            node_name=node_name,
            job_id=job.id,
            org_name=org_name,
        ),
        robust=True,
    )
    return attempt


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
