"""The policy's input, read from the database: DB rows → `ClusterSnapshot`.

A fixed number of set-based queries, whatever the size of the fleet or the queue (no
per-row queries), each reading tuples (values_list / one SQL statement) rather than
model instances. Outside a test's transaction the reads share one REPEATABLE READ,
READ ONLY transaction, so they see one consistent state; decisions are still re-checked
by their own guarded transactions when applied, so a stale snapshot can only cause a
skipped decision, never a wrong one.

Bound on the queue: the policy serves each user strictly oldest first, so in one tick a
user's (N+1)th oldest job can start only after its N older ones; a tick places at most as
many jobs as there are free GPUs, which in steady state is a handful. So each tick reads
each user's oldest GANTRY_DISPATCH_MAX_QUEUED_PER_USER jobs, each org's oldest
GANTRY_DISPATCH_MAX_QUEUED_PER_ORG of those, and at most GANTRY_DISPATCH_MAX_QUEUED in
all, taken round-robin over users (everyone's first job before anyone's second), so no
flood can hide another user's head. Deeper jobs come into view as the heads start. The
windows run inside PostgreSQL (one sort there), and only the bounded rows cross the wire,
with times as epoch floats and ids as text so decoding them is cheap. The demand the
policy sees for an org is capped the same way, which only matters for an org whose
visible backlog already exceeds its fair share, where the cap changes nothing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count

from apps.accounts.models import Org
from apps.jobs.models import Attempt, AttemptState, GpuAssignment, Job, JobStatus
from apps.scheduler.models import Gpu, GpuType, Node, NodeClaim, UsageScope
from apps.scheduler.policy import (
    ClusterSnapshot,
    PolicyConfig,
    QueuedJob,
    RunningAllocation,
    UsageSnapshot,
)
from apps.scheduler.policy import Gpu as PolicyGpu
from apps.scheduler.policy import GpuType as PolicyGpuType
from apps.scheduler.policy import Node as PolicyNode
from apps.scheduler.services.usage import decayed_accounts, half_life_s, running_worth


@dataclass
class DispatchSnapshot:
    """The policy's input plus what the dispatcher needs beside it."""

    cluster: ClusterSnapshot
    db_now: datetime
    queue_depth: dict[str, int] = field(default_factory=dict)  # tier → all queued jobs
    queued_loaded: int = 0


def policy_config() -> PolicyConfig:
    """The policy's knobs from settings (half-life and any GANTRY_POLICY overrides)."""
    options = dict(settings.GANTRY_POLICY or {})
    options.setdefault("usage_half_life_s", float(settings.GANTRY_USAGE_HALF_LIFE_S))
    return PolicyConfig(**options)


def build_snapshot(*, config: PolicyConfig | None = None) -> DispatchSnapshot:
    """Read fleet, live allocations, the (bounded) queue, weights and usage at DB now().

    Guarantee: every GPU with a live GpuAssignment is marked not free; every live
    attempt is a running allocation (stopping if its job is being preempted or
    cancelled); only queued jobs whose backoff (not_before) has passed are offered.
    Ids in the snapshot are strings (jobs, attempts, orgs, users) and integers (GPUs);
    times are epoch seconds of the database clock, computed by PostgreSQL.
    """
    config = config or policy_config()
    with _consistent_reads():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now(), extract(epoch FROM now())::float8")
            db_now, now = cursor.fetchone()
        gpu_types = [
            PolicyGpuType(name=name, memory_gb=memory, price_per_gpu_hour=price)
            for name, memory, price in GpuType.objects.values_list(
                "name", "memory_gb", "price_per_gpu_hour"
            )
        ]
        gpus_of = _live_assignments()
        nodes = _nodes({gpu for gpus in gpus_of.values() for gpu in gpus})
        running, held_by_owner = _running(now, gpus_of)
        queued = _queued()
        org_ids = {job.org for job in queued} | {a.org for a in running}
        org_weights = {
            str(pk): weight
            for pk, weight in Org.objects.filter(pk__in=org_ids).values_list("pk", "weight")
        }
        usage = _usage(db_now, held_by_owner, config)
        depth = dict(
            Job.objects.filter(status=JobStatus.QUEUED)
            .order_by()
            .values_list("tier")
            .annotate(n=Count("id"))
        )
    cluster = ClusterSnapshot(
        now=now,
        gpu_types=gpu_types,
        nodes=nodes,
        running=running,
        queued=queued,
        org_weights=org_weights,
        usage=usage,
        config=config,
    )
    return DispatchSnapshot(
        cluster=cluster, db_now=db_now, queue_depth=depth, queued_loaded=len(queued)
    )


def _rows(sql: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _live_assignments() -> dict[str, list[int]]:
    """attempt id → ids of the GPUs it holds (live assignments only)."""
    gpus_of: dict[str, list[int]] = {}
    table = GpuAssignment._meta.db_table
    for attempt_id, gpu_id in _rows(
        f"SELECT attempt_id::text, gpu_id FROM {table} WHERE released_at IS NULL"  # noqa: S608
    ):
        gpus_of.setdefault(attempt_id, []).append(gpu_id)
    return gpus_of


NODES_SQL = """
SELECT g.id, g.index, g.gpu_type_id, n.name, n.state
FROM {gpu} g JOIN {node} n ON n.id = g.node_id
WHERE n.state <> 'down'
ORDER BY n.name, g.index
"""


def _nodes(held_gpus: set[int]) -> list[PolicyNode]:
    nodes: dict[str, PolicyNode] = {}
    sql = NODES_SQL.format(gpu=Gpu._meta.db_table, node=Node._meta.db_table)
    for gpu_id, index, gpu_type, node_name, state in _rows(sql):
        node = nodes.get(node_name)
        if node is None:
            node = nodes[node_name] = PolicyNode(name=node_name, gpus=[], state=state)
        node.gpus.append(
            PolicyGpu(id=gpu_id, index=index, type=gpu_type, free=gpu_id not in held_gpus)
        )
    return list(nodes.values())


RUNNING_SQL = """
SELECT a.id::text, a.job_id::text, n.name, a.state,
       extract(epoch FROM COALESCE(a.started_at, a.created_at))::float8,
       a.started_at IS NOT NULL,
       j.tier, j.org_id::text, COALESCE(j.user_id::text, ''), j.status, j.cancel_requested,
       j.max_runtime_s, j.preemptible, j.preemption_count
FROM {attempt} a
JOIN {job} j ON j.id = a.job_id
JOIN {node} n ON n.id = a.node_id
WHERE a.state <> 'finished'
ORDER BY a.created_at
"""


def _running(now: float, gpus_of: dict[str, list[int]]):
    """Live attempts as allocations, and (tier, org, user, GPUs, seconds held) for usage."""
    sql = RUNNING_SQL.format(
        attempt=Attempt._meta.db_table, job=Job._meta.db_table, node=Node._meta.db_table
    )
    running, held_by_owner = [], []
    for (
        attempt_id,
        job_id,
        node_name,
        state,
        started,
        claimed,
        tier,
        org,
        user,
        job_status,
        cancel_requested,
        max_runtime_s,
        preemptible,
        preemptions,
    ) in _rows(sql):
        gpu_ids = tuple(sorted(gpus_of.get(attempt_id, ())))
        running.append(
            RunningAllocation(
                id=attempt_id,
                job_id=job_id,
                node=node_name,
                gpu_ids=gpu_ids,
                tier=tier,
                org=org,
                user=user,
                # A claimed attempt counts from its start; an unclaimed one from placement.
                started_at=started,
                max_runtime_s=float(max_runtime_s),
                preemptible=preemptible,
                last_checkpoint_at=None,  # not tracked per attempt: assume the worst
                preemptions=preemptions,
                stopping=(
                    state == AttemptState.STOPPING
                    or job_status == JobStatus.PREEMPTING
                    or cancel_requested
                ),
            )
        )
        if claimed and gpu_ids:
            held_by_owner.append((tier, org, user, len(gpu_ids), now - started))
    return running, held_by_owner


# Each user's oldest N (by queue order), then each org's oldest M of those, then at most
# `total` rows taken round-robin over users (every user's 1st job, then every 2nd, ...),
# so a huge queue can hide neither a small org's head nor a new user's. Claimed jobs are
# always offered. Times come back as epoch floats: cheap to read, one clock.
QUEUED_SQL = """
WITH per_user AS (
    SELECT id, tier, org_id, user_id, queued_at, created_at, gpu_count, max_runtime_s,
           gpu_types, min_gpu_memory_gb, preemptible, preemption_count,
           row_number() OVER (PARTITION BY org_id, user_id
                              ORDER BY queued_at, id) AS user_position
    FROM {job}
    WHERE status = 'queued' AND (not_before IS NULL OR not_before <= now())
), per_org AS (
    SELECT *, row_number() OVER (PARTITION BY org_id ORDER BY queued_at, id) AS org_position
    FROM per_user WHERE user_position <= %(per_user)s
), offered AS (
    (SELECT id FROM per_org WHERE org_position <= %(per_org)s
     ORDER BY user_position, queued_at, id LIMIT %(total)s)
    UNION
    SELECT job_id FROM {claim}
)
SELECT j.id::text, j.tier, j.org_id::text, COALESCE(j.user_id::text, ''),
       -- a preempted job keeps its place: it has waited since it was submitted
       extract(epoch FROM CASE WHEN j.preemption_count > 0 THEN j.created_at
                               ELSE j.queued_at END)::float8,
       j.gpu_count, j.max_runtime_s, j.gpu_types, j.min_gpu_memory_gb, j.preemptible,
       j.preemption_count, n.name
FROM offered o
JOIN {job} j ON j.id = o.id
LEFT JOIN {claim} c ON c.job_id = j.id
LEFT JOIN {node} n ON n.id = c.node_id
WHERE j.status = 'queued' AND (j.not_before IS NULL OR j.not_before <= now())
ORDER BY j.queued_at, j.id
"""


def _queued() -> list[QueuedJob]:
    sql = QUEUED_SQL.format(
        job=Job._meta.db_table, claim=NodeClaim._meta.db_table, node=Node._meta.db_table
    )
    params = {
        "per_user": settings.GANTRY_DISPATCH_MAX_QUEUED_PER_USER,
        "per_org": settings.GANTRY_DISPATCH_MAX_QUEUED_PER_ORG,
        "total": settings.GANTRY_DISPATCH_MAX_QUEUED,
    }
    return [
        QueuedJob(
            id=job_id,
            tier=tier,
            org=org,
            user=user,
            submitted_at=submitted,
            gpu_count=gpu_count,
            max_runtime_s=float(max_runtime_s),
            gpu_types=tuple(gpu_types or ()),
            min_gpu_memory_gb=float(min_memory),
            preemptible=preemptible,
            preemptions=preemptions,
            claimed_node=claimed_node,
        )
        for (
            job_id,
            tier,
            org,
            user,
            submitted,
            gpu_count,
            max_runtime_s,
            gpu_types,
            min_memory,
            preemptible,
            preemptions,
            claimed_node,
        ) in _rows(sql, params)
    ]


def _usage(db_now: datetime, held_by_owner, config: PolicyConfig) -> UsageSnapshot:
    """Recorded (finished attempts) plus running (held since start) decayed usage."""
    half_life = config.usage_half_life_s or half_life_s()
    by_tier: dict[str, float] = {}
    by_org: dict[str, float] = {}
    by_user: dict[tuple[str, str], float] = {}
    for (scope, key), value in decayed_accounts(db_now).items():
        if scope == UsageScope.TIER:
            by_tier[key] = value
        elif scope == UsageScope.ORG:
            by_org[key] = value
        else:
            org, _, user = key.partition("/")
            by_user[(org, user)] = value
    for tier, org, user, gpus, elapsed in held_by_owner:
        worth = running_worth(elapsed, gpus, half_life)
        by_tier[tier] = by_tier.get(tier, 0.0) + worth
        by_org[org] = by_org.get(org, 0.0) + worth
        key = (org, user)
        by_user[key] = by_user.get(key, 0.0) + worth
    return UsageSnapshot(by_tier=by_tier, by_org=by_org, by_user=by_user)


@contextlib.contextmanager
def _consistent_reads():
    """One REPEATABLE READ, READ ONLY transaction, unless already inside one (tests)."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield
