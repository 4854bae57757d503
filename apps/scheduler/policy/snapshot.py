"""What the policy reads (a `ClusterSnapshot`) and what it answers (`Place`, `Preempt`).

Plain dataclasses with no behaviour worth mentioning: the dispatcher fills them from the
database, the simulator from its virtual cluster. The policy never mutates them.

Ids (GPU, job, allocation) are opaque: anything hashable and comparable within one
snapshot (database primary keys or strings). Times are float seconds on one clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from .config import PolicyConfig

Id = Hashable


class NodeState:
    """Node states; only ACTIVE nodes receive placements (or are targeted by preemption)."""

    ACTIVE = "active"
    DRAINING = "draining"  # keeps running what it has, gets nothing new
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    memory_gb: float
    price_per_gpu_hour: int = 0  # micro-credits; "any type" jobs try cheaper types first


@dataclass(slots=True)
class Gpu:
    id: Id
    index: int  # position on its node (CUDA device index)
    type: str
    free: bool = True  # not held by any allocation (including one that is stopping)


@dataclass(slots=True)
class Node:
    name: str
    gpus: Sequence[Gpu]
    state: str = NodeState.ACTIVE


@dataclass(slots=True)
class RunningAllocation:
    """GPUs held by one attempt of a job (scheduled, running or stopping)."""

    id: Id
    job_id: Id
    node: str
    gpu_ids: tuple[Id, ...]
    tier: str
    org: str
    user: str
    started_at: float  # start or resume of this attempt
    max_runtime_s: float  # runtime allowed to this attempt: expected end = started_at + this
    preemptible: bool = True
    last_checkpoint_at: float | None = None  # None: no checkpoint since started_at
    preemptions: int = 0  # times this job has been preempted before
    stopping: bool = False  # being preempted or cancelled: GPUs return soon, never a victim

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_ids)

    @property
    def expected_end(self) -> float:
        return self.started_at + self.max_runtime_s


@dataclass(slots=True)
class QueuedJob:
    id: Id
    tier: str
    org: str
    user: str
    submitted_at: float  # when it joined the queue; a preempted job keeps its original time
    gpu_count: int  # 1..8, all on one node and of one type
    max_runtime_s: float
    gpu_types: tuple[str, ...] = ()  # allowed types, most preferred first; () = any
    min_gpu_memory_gb: float = 0.0
    preemptible: bool = True
    preemptions: int = 0
    avoid_nodes: frozenset[str] = frozenset()
    """Nodes where earlier attempts of the job failed: a retry goes elsewhere when some
    other node has room, and to one of these rather than not at all."""
    claimed_node: str | None = None
    """Node being freed for this job, by a `Preempt` (victims stopping) or a `Reserve`
    (running jobs draining). The dispatcher sets it from those decisions and clears it on
    placement. The policy starts the job there as soon as the GPUs are free, ahead of
    everyone else, and keeps other jobs off them meanwhile (unless they finish first)."""


@dataclass(frozen=True, slots=True)
class QueueBacklog:
    """Queued jobs of one (tier, org) that the snapshot does not list (see `queue_window`).

    A round considers each user's first `window_depth` jobs, of at most
    `queue_window_max_jobs` users; the others only count towards the org's demand (its
    fair entitlement, which decides whether it may preempt). Below that many users, each
    user's oldest job is always listed, so the oldest job of an org, which aging reads,
    is always among the listed ones."""

    jobs: int = 0
    gpus: int = 0  # GPUs the jobs ask for, together
    gpu_seconds: float = 0.0  # their GPUs times their max runtimes, together


@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    """Decayed GPU-seconds as of the snapshot's `now` (see `usage.decay`)."""

    by_tier: Mapping[str, float] = field(default_factory=dict)
    by_org: Mapping[str, float] = field(default_factory=dict)
    by_user: Mapping[tuple[str, str], float] = field(default_factory=dict)  # (org, user)


@dataclass(slots=True)
class ClusterSnapshot:
    now: float
    gpu_types: Sequence[GpuType]
    nodes: Sequence[Node]
    running: Sequence[RunningAllocation]
    queued: Sequence[QueuedJob]
    """Queued jobs the round may consider: each user's first `queue_depth_per_user` in
    FIFO order and every job with a claim (see `queue_window`). A snapshot may list more;
    the policy then leaves the deeper ones out itself, with the same result."""
    org_weights: Mapping[str, float] = field(default_factory=dict)  # missing org: weight 1
    usage: UsageSnapshot = field(default_factory=UsageSnapshot)
    config: PolicyConfig = field(default_factory=PolicyConfig)
    backlog: Mapping[tuple[str, str], QueueBacklog] = field(default_factory=dict)
    """(tier, org) -> queued jobs not listed in `queued` (beyond each user's depth)."""
    runtime_ratio: float = 1.0
    """How much of its max_runtime_s a job runs, typically (the median of recent
    attempts), for a tier missing from `runtime_ratios_by_tier`. Start-time estimates
    expect each job to run this fraction."""
    late_runtime_ratio: float = 1.0
    """How much of its max_runtime_s a job runs at the late end (the 75th percentile of
    recent attempts), for a tier missing from `runtime_ratios_by_tier`. A preemption is
    held back (`preemption_hold_back_s`) only for GPUs expected free by this ratio: at the
    median, half the jobs run longer than expected, and on a large fleet some node always
    looked about to free up."""
    runtime_ratios_by_tier: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """tier -> (typical, late) ratio observed on that tier's own recent attempts, which
    its jobs are expected to run instead of the two above (the dispatch tick and the
    simulator give every tier). Per tier because tiers run different work: on `make up`,
    enterprise's short requests (1.5 s of a 600 s max runtime) made free jobs of 300 s
    look about to end, and held enterprise's next preemption back."""

    def typical_ratio(self, tier: str) -> float:
        """The share of its max runtime a job of `tier` is expected to run."""
        ratios = self.runtime_ratios_by_tier.get(tier)
        return self.runtime_ratio if ratios is None else ratios[0]

    def late_ratio(self, tier: str) -> float:
        """The share of its max runtime a job of `tier` runs at the late end."""
        ratios = self.runtime_ratios_by_tier.get(tier)
        return self.late_runtime_ratio if ratios is None else ratios[1]


@dataclass(frozen=True, slots=True)
class Place:
    """Start `job_id` on `gpu_ids` (all on `node`, all of `gpu_type`), which are free now."""

    job_id: Id
    node: str
    gpu_ids: tuple[Id, ...]
    gpu_type: str
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop these allocations (all on `node`) so that `for_job_id` can run there.

    The GPUs are not handed over in this call: they are free once the victims have
    left, and a later call places `for_job_id` there (see `QueuedJob.claimed_node`).
    """

    allocation_ids: tuple[Id, ...]
    job_ids: tuple[Id, ...]
    node: str
    for_job_id: Id
    reason: str


@dataclass(frozen=True, slots=True)
class Reserve:
    """Drain GPUs of `node` for `job_id`, a multi-GPU job that fits nowhere now.

    Nothing is stopped: from now on other jobs start on those GPUs only if they finish by
    `start_at` (backfill). The dispatcher records `node` as the job's `claimed_node`, so
    that later rounds keep draining the same node until the job starts there (a dispatcher
    that ignores this decision still gets correct, but less sticky, reservations)."""

    job_id: Id
    node: str
    gpu_type: str
    start_at: float  # when the GPUs are expected to be free (from max runtimes)
    reason: str


Decision = Place | Preempt | Reserve


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a queued job the round looked at was not placed, and when it may start.

    `public_reason` is for its tenant: it names no other tenant, job or internal score.
    `reason` is the whole story, for operators. `position` is 1 for the next job to start
    among those that compete for the same GPU types; `estimated_start` is the snapshot's
    clock, or None when nothing is known (a job that could never fit)."""

    job_id: Id
    reason: str
    public_reason: str
    position: int | None
    estimated_start: float | None


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round decided, and (with `explain`) why every other looked-at job waits."""

    decisions: list[Decision]
    waiting: list[Waiting]
