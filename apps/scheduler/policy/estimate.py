"""Start-time estimates and queue positions for the jobs a round leaves waiting.

A list schedule over GPU types: every GPU of an active node is free at some time (now if
free, else when its allocation is expected to end: its start plus `runtime_ratio` of its
max runtime, or the grace period for one that is stopping). The waiting jobs, in the
order the round served them (then the rest, highest tier and oldest first), each take
the `gpu_count` earliest-free GPUs of their best allowed type, and hold them for their
own expected runtime. What it leaves out, deliberately: that a job's GPUs must be on one
node (a multi-GPU job may start later than estimated), preemption (a higher tier may
start earlier), and jobs yet to arrive (a later higher-priority job may push a start
back). The simulator measures the error against the actual starts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence

from .snapshot import Id, Node, NodeState, QueuedJob, RunningAllocation

# Beyond this many seconds an estimate says nothing useful: reported as unknown.
HORIZON_S = 7 * 24 * 3600.0


def typical_end(
    allocation: RunningAllocation,
    *,
    now: float,
    runtime_ratio: float,
    stop_delay_s: float,
    bound_overdue: bool = False,
) -> float:
    """When the allocation is expected to give its GPUs back: after `stop_delay_s` if it
    is stopping, else at its start plus `runtime_ratio` of its max runtime (never
    before `now`). The one expectation the estimates and the preemption hold-back share;
    placement and reservations keep the max runtime, which bounds rather than expects.
    With `bound_overdue` (the hold-back), a job already past that typical end is bounded
    only by its max runtime: counted as ending now, every overdue long job looked about to
    end and held paid's preemptions back (steady: paid p95 268 s against 359 s)."""
    if allocation.stopping:
        return now + stop_delay_s
    end = allocation.started_at + runtime_ratio * allocation.max_runtime_s
    if bound_overdue and end <= now:
        end = allocation.started_at + allocation.max_runtime_s
    return max(now, end)


def free_times(
    nodes: Sequence[Node],
    running: Sequence[RunningAllocation],
    placed: Mapping[Id, float],
    *,
    now: float,
    runtime_ratio: float,
    stop_delay_s: float,
) -> dict[str, list[float]]:
    """GPU type -> a min-heap of the times each GPU of that type is expected to be free.

    `placed`: GPU id -> expected end of a job placed on it in this round."""
    ends: dict[Id, float] = {}
    for allocation in running:
        end = typical_end(
            allocation, now=now, runtime_ratio=runtime_ratio, stop_delay_s=stop_delay_s
        )
        for gpu_id in allocation.gpu_ids:
            ends[gpu_id] = end
    ends.update(placed)
    heaps: dict[str, list[float]] = {}
    for node in nodes:
        if node.state != NodeState.ACTIVE:
            continue
        for gpu in node.gpus:
            heaps.setdefault(gpu.type, []).append(ends.get(gpu.id, now))
    for heap in heaps.values():
        heapq.heapify(heap)
    return heaps


def estimate(
    jobs: Iterable[QueuedJob],
    heaps: dict[str, list[float]],
    allowed_types: Callable[[QueuedJob], tuple[str, ...]],
    *,
    now: float,
    runtime_ratio: float,
) -> dict[Id, tuple[int, float | None]]:
    """job id -> (position among the jobs ahead that compete for a GPU type it may use,
    estimated start or None). `heaps` is consumed."""
    result: dict[Id, tuple[int, float | None]] = {}
    ahead_by_types: dict[tuple[str, ...], int] = {}
    for job in jobs:
        types = allowed_types(job)
        ahead = sum(
            count for other, count in ahead_by_types.items() if not types or set(other) & set(types)
        )
        ahead_by_types[types] = ahead_by_types.get(types, 0) + 1
        best_type, best_start = None, None
        for gpu_type in types:
            heap = heaps.get(gpu_type)
            if not heap or len(heap) < job.gpu_count:
                continue
            # The job's count-th earliest GPU: pop that many (a handful), then put back.
            earliest = [heapq.heappop(heap) for _ in range(job.gpu_count)]
            for time in earliest:
                heapq.heappush(heap, time)
            if best_start is None or earliest[-1] < best_start:
                best_type, best_start = gpu_type, earliest[-1]
        if best_type is None:
            result[job.id] = (ahead + 1, None)
            continue
        heap = heaps[best_type]
        end = best_start + runtime_ratio * job.max_runtime_s
        for _ in range(job.gpu_count):
            heapq.heapreplace(heap, end)
        start = max(now, best_start)
        result[job.id] = (ahead + 1, start if start - now <= HORIZON_S else None)
    return result
