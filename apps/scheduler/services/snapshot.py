"""The policy's input, read from the database: DB rows → `ClusterSnapshot`.

A fixed number of set-based queries, whatever the size of the fleet or the queue (no
per-row queries), each reading tuples (values_list / one SQL statement) rather than
model instances. Outside a test's transaction the reads share one REPEATABLE READ,
READ ONLY transaction, so they see one consistent state; decisions are still re-checked
by their own guarded transactions when applied, so a stale snapshot can only cause a
skipped decision, never a wrong one.

Bound on the queue (the policy's queue window, `apps.scheduler.policy.window`): the
policy serves each user strictly oldest first, so in one tick a user's (N+1)th oldest job
can start only after its N older ones. So each tick reads, of each user, only the first
`window_depth` eligible jobs in the policy's FIFO order (2,048 jobs shared max-min
between users, at least 4 of each), plus every job with a node claim, and
one `GROUP BY` row per (tier, org) with the number and GPUs of all its eligible queued
jobs, from which the jobs left out become the snapshot's `backlog` (the org's demand, for
entitlements, stays exact). Every user's oldest job is listed, so no flood can hide
another user's head; deeper jobs come into view as the older ones start. The window is a
`row_number()` inside PostgreSQL (one sort there), and only the bounded rows cross the
wire, with times as epoch floats and ids as text so decoding them is cheap. The
simulator builds its snapshots with the same window, so both run the policy on the same
kind of input.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction

from apps.accounts.models import Org
from apps.fleet import liveness
from apps.fleet.models import Gpu, GpuType, Node
from apps.jobs.models import Attempt, AttemptState, GpuAssignment, Job, JobStatus
from apps.jobs.selectors import nodes_to_avoid
from apps.scheduler.checks import configured_policy
from apps.scheduler.models import NodeClaim, UsageScope
from apps.scheduler.policy import (
    ClusterSnapshot,
    PolicyConfig,
    QueueBacklog,
    QueuedJob,
    RunningAllocation,
    UsageSnapshot,
    backlog_beside,
    garbage_collector_paused,
    observed_runtime_ratios_by_tier,
)
from apps.scheduler.policy import Gpu as PolicyGpu
from apps.scheduler.policy import GpuType as PolicyGpuType
from apps.scheduler.policy import Node as PolicyNode
from apps.scheduler.policy import NodeState as PolicyNodeState
from apps.scheduler.services.usage import decayed_accounts, half_life_s, running_worth


@dataclass
class DispatchSnapshot:
    """The policy's input plus what the dispatcher needs beside it."""

    cluster: ClusterSnapshot
    db_now: datetime
    queue_depth: dict[str, int] = field(default_factory=dict)  # tier → all queued jobs
    queued_loaded: int = 0  # jobs listed in the snapshot (the queue window)


@garbage_collector_paused()  # tens of thousands of rows become objects, none in a cycle
def build_snapshot(*, config: PolicyConfig | None = None) -> DispatchSnapshot:
    """Read fleet, live allocations, the (bounded) queue, weights and usage at DB now().

    Guarantee: every GPU with a live GpuAssignment is marked not free; every live
    attempt is a running allocation (stopping if its job is being preempted or
    cancelled); only queued jobs whose backoff (not_before) has passed are offered, and
    none that never started and is past its start deadline (start_deadline_at).
    Ids in the snapshot are strings (jobs, attempts, orgs, users) and integers (GPUs);
    times are epoch seconds of the database clock, computed by PostgreSQL.
    """
    config = config or configured_policy()
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
        queued = _queued(config)
        depth, backlog = _queue_totals(queued)
        org_ids = {job.org for job in queued} | {a.org for a in running}
        org_weights = _org_weights(org_ids)
        usage = _usage(db_now, held_by_owner, config)
        runtime_ratios = _runtime_ratios(config)
    cluster = ClusterSnapshot(
        now=now,
        gpu_types=gpu_types,
        nodes=nodes,
        running=running,
        queued=queued,
        org_weights=org_weights,
        usage=usage,
        config=config,
        backlog=backlog,
        runtime_ratios_by_tier=runtime_ratios,
    )
    return DispatchSnapshot(
        cluster=cluster, db_now=db_now, queue_depth=depth, queued_loaded=len(queued)
    )


# Each tier's share of max_runtime_s that its recent successful attempts ran, newest
# first (the policy's `observed_runtime_ratios_by_tier` turns them into each tier's
# typical and late ratio).
_RUNTIME_RATIO_SQL = f"""
SELECT j.tier,
       extract(epoch FROM a.finished_at - a.started_at) / greatest(j.max_runtime_s, 1)
  FROM {Attempt._meta.db_table} a JOIN {Job._meta.db_table} j ON j.id = a.job_id
 WHERE a.started_at IS NOT NULL AND a.finished_at >= now() - interval '1 hour'
   AND a.exit_class = 'succeeded'
 ORDER BY a.finished_at DESC
 LIMIT 600
"""  # noqa: S608 (table names from model metadata)


def _runtime_ratios(config: PolicyConfig) -> dict[str, tuple[float, float]]:
    """Each tier's typical and late runtime ratio, from the newest 600 successful attempts
    of the last hour, whatever their tiers (a tier with fewer than the policy's minimum
    among them expects its jobs to run their whole max runtime)."""
    return observed_runtime_ratios_by_tier(
        _rows(_RUNTIME_RATIO_SQL), min_samples=config.runtime_ratio_min_samples
    )


def _org_weights(org_ids: set[str]) -> dict[str, float]:
    """The fair-share weights of these orgs other than 1 (the policy's default for a
    missing org): one parameter, however many orgs queue, sent as one array literal
    (the ids are UUID strings: quoting 20,000 of them one by one took 50 ms)."""
    sql = (
        f"SELECT id::text, weight FROM {Org._meta.db_table}"  # noqa: S608
        " WHERE id = ANY(%s::uuid[]) AND weight <> 1"
    )
    return dict(_rows(sql, ["{" + ",".join(org_ids) + "}"]))


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
    # A node whose worker went silent keeps what it runs (its leases decide) and gets
    # nothing new, as a draining node (apps.fleet.liveness).
    active = [name for name, node in nodes.items() if node.state == PolicyNodeState.ACTIVE]
    for name in liveness.silent_nodes(active):
        nodes[name].state = PolicyNodeState.DRAINING
    return list(nodes.values())


RUNNING_SQL = """
SELECT a.id::text, a.job_id::text, n.name, a.state,
       extract(epoch FROM COALESCE(a.started_at, a.created_at))::float8,
       a.started_at IS NOT NULL,
       j.tier, j.org_id::text, COALESCE(j.user_id::text, ''), j.status, j.cancel_requested,
       j.max_runtime_s, j.preemptible, j.preemption_count,
       extract(epoch FROM a.checkpointed_at)::float8
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
        checkpointed,
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
                last_checkpoint_at=checkpointed,  # None: all work since the start is lost
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


# The queue window (`apps.scheduler.policy.window`): each user's first `depth` eligible
# jobs in the policy's FIFO order (a preempted job keeps its place: it has waited since it
# was submitted), plus every job with a claim; `depth` is `window_depth`: the largest
# that keeps sum(min(user's jobs, depth)) within the window, and at least `per_user`,
# unless that lists more than `max_jobs`: then the largest within `max_jobs`, at least 1.
# With more users than `max_jobs`, only the users `listed_users` picks: per tier the same
# number (max-min), each org's users oldest head first, every org's first user before
# any org's second (those steps run only then: PostgreSQL evaluates a CASE branch's
# subquery only when it is taken, and a one-time filter gates each branch of `offered`).
# The cut takes whole ranks in org (every org's first user, then every second...) and
# sorts only the rank it splits, with a LIMIT: one sort of the heads fewer than
# numbering every head within its tier (on 100,000 one-job users, the read 987 -> 768 ms
# at the median of ten interleaved runs).
# Times come back as epoch floats: cheap to read, one clock. A job that never started and
# is past its start deadline is not eligible: it is never placed, and the deadline sweep
# (jobs.services.deadlines) cancels it; one that started before (preempted, retried) met it.
QUEUED_SQL = """
WITH eligible AS (
    SELECT id, tier, org_id, user_id,
           CASE WHEN preemption_count > 0 THEN created_at ELSE queued_at END AS submitted
    FROM {job}
    WHERE status = 'queued' AND (not_before IS NULL OR not_before <= now())
      AND (start_deadline_at IS NULL OR start_deadline_at > now() OR started_at IS NOT NULL)
), ranked AS (
    SELECT id, tier, org_id, user_id, submitted,
           row_number() OVER (PARTITION BY org_id, user_id ORDER BY submitted, id) AS position
    FROM eligible
), levels AS (
    -- users with at least `position` jobs, per position, and the jobs listed down to it
    SELECT position, sum(users) OVER (ORDER BY position) AS listed
    FROM (SELECT position, count(*) AS users FROM ranked GROUP BY position) p
), window_depth AS (
    -- the deepest level whose jobs, with all shallower ones, fit in the window
    SELECT greatest(%(per_user)s,
                    coalesce(max(position) FILTER (WHERE listed <= %(window)s), 0)) AS depth
    FROM levels
), capped_depth AS MATERIALIZED (  -- one row, computed once
    SELECT CASE
        WHEN coalesce((SELECT max(listed) FROM levels l WHERE l.position <= w.depth), 0)
             <= %(max_jobs)s THEN w.depth
        ELSE greatest(1, (SELECT coalesce(max(position), 0) FROM levels
                          WHERE listed <= %(max_jobs)s))
    END AS depth
    FROM window_depth w
), heads AS (
    -- each user's oldest job (read only when users are cut)
    SELECT id, tier, org_id, user_id, submitted FROM ranked WHERE position = 1
), in_org AS MATERIALIZED (
    -- and its rank within its org, oldest head first
    SELECT id, tier, submitted, org_id, user_id,
           row_number() OVER (PARTITION BY tier, org_id ORDER BY submitted, user_id) AS in_org
    FROM heads
), org_levels AS MATERIALIZED (
    -- per tier and rank in org: the users at that rank, and those at every rank before it
    SELECT tier, in_org, count(*) AS users,
           sum(count(*)) OVER (PARTITION BY tier ORDER BY in_org) - count(*) AS before
    FROM in_org GROUP BY tier, in_org
), tier_users AS MATERIALIZED (  -- a row per tier
    SELECT tier, sum(users)::bigint AS users FROM org_levels GROUP BY tier
), users_per_tier AS MATERIALIZED (
    -- NULL: every user is listed (the users are the listed jobs at depth 1). Else the
    -- most users per tier, k, with sum(least(users, k)) within max_jobs: k is a tier's
    -- count, or the equal share of what the tiers at or below a count leave to the rest.
    SELECT CASE WHEN (SELECT listed FROM levels WHERE position = 1) <= %(max_jobs)s
                THEN NULL ELSE (
        SELECT coalesce(max(k), 0) FROM (
            SELECT users AS k FROM tier_users
            UNION ALL
            SELECT (%(max_jobs)s - (SELECT coalesce(sum(b.users), 0) FROM tier_users b
                                    WHERE b.users <= a.users))::bigint
                   / nullif((SELECT count(*) FROM tier_users c WHERE c.users > a.users), 0)
            FROM (SELECT users FROM tier_users UNION ALL SELECT 0) a
        ) candidates
        WHERE k >= 0
          AND (SELECT sum(least(users, k)) FROM tier_users) <= %(max_jobs)s
    ) END AS cutoff
), offered AS (
    -- each branch gated by a one-time filter on the cut, so that the other's CTEs never run
    SELECT r.id FROM capped_depth d, ranked r
    WHERE (SELECT cutoff IS NULL FROM users_per_tier) AND r.position <= d.depth
    UNION ALL
    -- the ranks in org that fit whole
    SELECT h.id FROM org_levels l JOIN in_org h ON h.tier = l.tier AND h.in_org = l.in_org
    WHERE (SELECT cutoff IS NOT NULL FROM users_per_tier)
      AND l.before + l.users <= (SELECT cutoff FROM users_per_tier)
    UNION ALL
    -- of the rank that fits in part, its oldest heads
    SELECT x.id FROM users_per_tier u, org_levels l,
           LATERAL (SELECT h.id FROM in_org h WHERE h.tier = l.tier AND h.in_org = l.in_org
                    ORDER BY h.submitted, h.org_id, h.user_id
                    LIMIT u.cutoff - l.before) x
    WHERE (SELECT cutoff IS NOT NULL FROM users_per_tier)
      AND l.before < u.cutoff AND l.before + l.users > u.cutoff
    UNION
    SELECT job_id FROM {claim}
)
SELECT j.id::text, j.tier, j.org_id::text, COALESCE(j.user_id::text, ''),
       extract(epoch FROM CASE WHEN j.preemption_count > 0 THEN j.created_at
                               ELSE j.queued_at END)::float8,
       j.gpu_count, j.max_runtime_s, j.gpu_types, j.min_gpu_memory_gb, j.preemptible,
       j.preemption_count, n.name, j.attempt_count > j.preemption_count
FROM offered o
JOIN {job} j ON j.id = o.id
LEFT JOIN {claim} c ON c.job_id = j.id
LEFT JOIN {node} n ON n.id = c.node_id
WHERE j.status = 'queued' AND (j.not_before IS NULL OR j.not_before <= now())
  AND (j.start_deadline_at IS NULL OR j.start_deadline_at > now() OR j.started_at IS NOT NULL)
ORDER BY CASE WHEN j.preemption_count > 0 THEN j.created_at ELSE j.queued_at END, j.id
"""

# Every queued job, per (tier, org): all of them (the queue-depth gauge), and those
# eligible now with the GPUs they ask for (the org's demand, listed or not), eligible as
# QUEUED_SQL has it.
QUEUE_TOTALS_SQL = """
SELECT tier, org_id::text, count(*),
       count(*) FILTER (WHERE {eligible}),
       COALESCE(sum(gpu_count) FILTER (WHERE {eligible}), 0),
       COALESCE(sum(gpu_count::bigint * max_runtime_s) FILTER (WHERE {eligible}), 0)
FROM {job}
WHERE status = 'queued'
GROUP BY tier, org_id
"""
_ELIGIBLE_NOW = (
    "(not_before IS NULL OR not_before <= now())"
    " AND (start_deadline_at IS NULL OR start_deadline_at > now() OR started_at IS NOT NULL)"
)


def _queued(config: PolicyConfig) -> list[QueuedJob]:
    sql = QUEUED_SQL.format(
        job=Job._meta.db_table, claim=NodeClaim._meta.db_table, node=Node._meta.db_table
    )
    params = {
        "per_user": config.queue_depth_per_user,
        "window": config.queue_window_jobs,
        "max_jobs": config.queue_window_max_jobs,
    }
    rows = _rows(sql, params)
    queued = [
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
            _retried,
        ) in rows
    ]
    _mark_nodes_to_avoid(queued, [row[0] for row in rows if row[-1]])
    return queued


def _mark_nodes_to_avoid(queued: list[QueuedJob], retried: list[str]) -> None:
    """Give each retried job the nodes where its earlier attempts failed."""
    if not retried:
        return
    avoid = nodes_to_avoid(retried)
    if not avoid:
        return
    names = dict(
        Node.objects.filter(pk__in={n for nodes in avoid.values() for n in nodes}).values_list(
            "pk", "name"
        )
    )
    for job in queued:
        nodes = avoid.get(uuid.UUID(job.id))
        if nodes:
            job.avoid_nodes = frozenset(names[n] for n in nodes if n in names)


def _queue_totals(
    listed: list[QueuedJob],
) -> tuple[dict[str, int], dict[tuple[str, str], QueueBacklog]]:
    """(tier → all queued jobs, (tier, org) → the eligible jobs `listed` leaves out)."""
    depth: dict[str, int] = {}
    totals: dict[tuple[str, str], tuple[int, int, float]] = {}
    for tier, org, queued, eligible, gpus, gpu_seconds in _rows(
        QUEUE_TOTALS_SQL.format(job=Job._meta.db_table, eligible=_ELIGIBLE_NOW)
    ):
        depth[tier] = depth.get(tier, 0) + queued
        totals[(tier, org)] = (eligible, int(gpus), float(gpu_seconds))
    backlog = backlog_beside(totals, listed)
    return depth, backlog


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
