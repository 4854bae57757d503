"""Terse constructors for hand-made snapshots (unit tests, benchmarks, examples).

    h1 = node("h1", "H100", gpus=8)
    a = allocation("a1", h1, [0, 1], tier="free", started_at=0, max_runtime_s=600)
    snap = snapshot([h1], queued=[job("j1", gpus=4)], running=[a], now=100)

`allocation` marks the GPUs it takes as not free on the node, as the database would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .config import PolicyConfig
from .snapshot import (
    ClusterSnapshot,
    Gpu,
    GpuType,
    Id,
    Node,
    NodeState,
    QueueBacklog,
    QueuedJob,
    RunningAllocation,
    UsageSnapshot,
)

H100 = GpuType("H100", memory_gb=80, price_per_gpu_hour=4_000_000)
A100 = GpuType("A100", memory_gb=40, price_per_gpu_hour=2_500_000)
DEFAULT_GPU_TYPES = (H100, A100)


def node(name: str, gpu_type: str = "H100", gpus: int = 8, state: str = NodeState.ACTIVE) -> Node:
    """A node of `gpus` free GPUs of one type, ids `name/0` … `name/{gpus-1}`."""
    return Node(
        name=name,
        gpus=[Gpu(id=f"{name}/{i}", index=i, type=gpu_type) for i in range(gpus)],
        state=state,
    )


def job(
    job_id: Id,
    tier: str = "paid",
    org: str = "org",
    user: str = "user",
    gpus: int = 1,
    submitted_at: float = 0.0,
    max_runtime_s: float = 3600.0,
    types: Sequence[str] = (),
    min_memory_gb: float = 0.0,
    preemptible: bool = True,
    preemptions: int = 0,
    claimed_node: str | None = None,
    avoid_nodes: Sequence[str] = (),
) -> QueuedJob:
    return QueuedJob(
        id=job_id,
        tier=tier,
        org=org,
        user=user,
        submitted_at=submitted_at,
        gpu_count=gpus,
        max_runtime_s=max_runtime_s,
        gpu_types=tuple(types),
        min_gpu_memory_gb=min_memory_gb,
        preemptible=preemptible,
        preemptions=preemptions,
        avoid_nodes=frozenset(avoid_nodes),
        claimed_node=claimed_node,
    )


def allocation(
    allocation_id: Id,
    on: Node,
    gpu_indexes: Iterable[int],
    tier: str = "paid",
    org: str = "org",
    user: str = "user",
    started_at: float = 0.0,
    max_runtime_s: float = 3600.0,
    job_id: Id | None = None,
    preemptible: bool = True,
    last_checkpoint_at: float | None = None,
    preemptions: int = 0,
    stopping: bool = False,
) -> RunningAllocation:
    """An allocation of the given GPUs of node `on`; marks them busy on the node."""
    gpus = [on.gpus[i] for i in gpu_indexes]
    for gpu in gpus:
        if not gpu.free:
            raise ValueError(f"GPU {gpu.id} is already allocated")
        gpu.free = False
    return RunningAllocation(
        id=allocation_id,
        job_id=job_id if job_id is not None else f"job-of-{allocation_id}",
        node=on.name,
        gpu_ids=tuple(gpu.id for gpu in gpus),
        tier=tier,
        org=org,
        user=user,
        started_at=started_at,
        max_runtime_s=max_runtime_s,
        preemptible=preemptible,
        last_checkpoint_at=last_checkpoint_at,
        preemptions=preemptions,
        stopping=stopping,
    )


def snapshot(
    nodes: Sequence[Node],
    queued: Sequence[QueuedJob] = (),
    running: Sequence[RunningAllocation] = (),
    now: float = 0.0,
    config: PolicyConfig | None = None,
    org_weights: Mapping[str, float] | None = None,
    usage: UsageSnapshot | None = None,
    gpu_types: Sequence[GpuType] = DEFAULT_GPU_TYPES,
    backlog: Mapping[tuple[str, str], QueueBacklog] | None = None,
) -> ClusterSnapshot:
    return ClusterSnapshot(
        now=now,
        gpu_types=list(gpu_types),
        nodes=list(nodes),
        running=list(running),
        queued=list(queued),
        org_weights=dict(org_weights or {}),
        usage=usage or UsageSnapshot(),
        config=config or PolicyConfig(),
        backlog=dict(backlog or {}),
    )
