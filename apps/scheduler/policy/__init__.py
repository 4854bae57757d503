"""Gantry's scheduling policy: a pure function from a cluster snapshot to decisions.

No Django, no I/O, no clock: the database dispatch tick and the discrete-event simulator
build a `ClusterSnapshot` and call `schedule(snapshot)`; they get back `Place` and
`Preempt` decisions (and `Reserve`, which keeps a node draining for a blocked multi-GPU
job), each with a human-readable reason for the audit trail.

    from apps.scheduler.policy import ClusterSnapshot, schedule
    decisions = schedule(snapshot)

See `policy.py` for what one call does and guarantees, `window.py` for which queued jobs
a call looks at, `fairshare.py` for the order of the queue, `placement.py` for gang
best-fit, reservations and backfill, `preemption.py` for victims and entitlements, and
`usage.py` for decayed usage.
"""

from .config import ENTERPRISE, FREE, PAID, TIER_RANK, TIERS, PolicyConfig, policy_with
from .estimate import observed_runtime_ratios, observed_runtime_ratios_by_tier
from .fairshare import FairShareQueue, Pick, RunningGpus, water_fill
from .gc_pause import garbage_collector_paused
from .placement import CapacityIndex, Pool, Reservation
from .policy import schedule, schedule_round
from .preemption import VictimFinder, is_victim_candidate, work_lost_gpu_seconds
from .snapshot import (
    ClusterSnapshot,
    Decision,
    Gpu,
    GpuType,
    Node,
    NodeState,
    Place,
    Preempt,
    QueueBacklog,
    QueuedJob,
    Reserve,
    RoundResult,
    RunningAllocation,
    UsageSnapshot,
    Waiting,
)
from .usage import DecayedUsage, accrue, decay, equivalent_gpus
from .window import QueueWindow, backlog_beside, listed_users, queue_window, window_depth

__all__ = [
    "ENTERPRISE",
    "FREE",
    "PAID",
    "TIERS",
    "TIER_RANK",
    "CapacityIndex",
    "ClusterSnapshot",
    "DecayedUsage",
    "Decision",
    "FairShareQueue",
    "Gpu",
    "GpuType",
    "Node",
    "NodeState",
    "Pick",
    "Place",
    "PolicyConfig",
    "Pool",
    "Preempt",
    "QueueBacklog",
    "QueueWindow",
    "QueuedJob",
    "Reservation",
    "Reserve",
    "RoundResult",
    "RunningAllocation",
    "RunningGpus",
    "UsageSnapshot",
    "VictimFinder",
    "Waiting",
    "accrue",
    "backlog_beside",
    "decay",
    "equivalent_gpus",
    "garbage_collector_paused",
    "is_victim_candidate",
    "listed_users",
    "observed_runtime_ratios",
    "observed_runtime_ratios_by_tier",
    "policy_with",
    "queue_window",
    "schedule",
    "schedule_round",
    "water_fill",
    "window_depth",
    "work_lost_gpu_seconds",
]
