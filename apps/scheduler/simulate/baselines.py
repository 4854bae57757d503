"""Baseline policies the report compares against (same snapshot in, same decisions out).

Both walk the queue in a fixed order and start every job that fits right now, with the
same gang best-fit placement as the real policy (one node, preferred type first), but
with no fair share, no reservations and no preemption:

- `fifo`: oldest submission first, whatever the tier;
- `strict`: highest tier first, then oldest first (strict priority).
"""

from __future__ import annotations

from collections.abc import Callable

from apps.scheduler.policy import TIER_RANK, CapacityIndex, ClusterSnapshot, Decision, Place
from apps.scheduler.policy.snapshot import QueuedJob


def fifo(snapshot: ClusterSnapshot) -> list[Decision]:
    return _greedy(snapshot, lambda job: (job.submitted_at, job.id), "FIFO")


def strict_priority(snapshot: ClusterSnapshot) -> list[Decision]:
    return _greedy(
        snapshot,
        lambda job: (-TIER_RANK.get(job.tier, 0), job.submitted_at, job.id),
        "strict priority",
    )


def _greedy(
    snapshot: ClusterSnapshot, order: Callable[[QueuedJob], tuple], name: str
) -> list[Decision]:
    index = CapacityIndex(
        snapshot.nodes,
        snapshot.running,
        snapshot.gpu_types,
        snapshot.now,
        stop_delay_s=snapshot.config.preemption_grace_s,
    )
    decisions: list[Decision] = []
    if index.free_gpus == 0:
        return decisions
    for job in sorted(snapshot.queued, key=order):
        types = index.allowed_types(job)
        if not types or job.gpu_count < 1 or not index.has_room(types, job.gpu_count):
            continue
        end = snapshot.now + job.max_runtime_s
        pool = index.best_fit(types, job.gpu_count, end, job.id)
        if pool is None:
            continue
        gpu_ids = index.take(pool, job.gpu_count, end, job.id)
        decisions.append(
            Place(
                job_id=job.id,
                node=pool.node,
                gpu_ids=gpu_ids,
                gpu_type=pool.gpu_type,
                reason=f"{name}: next in line that fits",
            )
        )
        if index.free_gpus == 0:
            break
    return decisions
