"""Prometheus series of the dispatcher (scraped through /metrics of each process).

The gauges are set by every dispatch tick from its snapshot (the dispatch tick runs in
the control worker, so that is where they are served); several processes may run ticks,
so they are "livemostrecent": the latest tick among live processes wins.
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

from apps.scheduler.policy import TIERS

TICK_SECONDS = Histogram(
    "gantry_dispatch_tick_seconds",
    "Wall time of one dispatch tick (snapshot, policy, applying decisions).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
POLICY_SECONDS = Histogram(
    "gantry_dispatch_policy_seconds",
    "Time spent in the pure policy per tick.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
TICKS = Counter(
    "gantry_dispatch_ticks_total",
    "Dispatch ticks by result (ran, or skipped because another dispatcher held the lock).",
    ["result"],
)
DECISIONS = Counter(
    "gantry_dispatch_decisions_total",
    "Policy decisions by kind (place, preempt) and outcome (applied, skipped).",
    ["kind", "outcome"],
)
QUEUE_DEPTH = Gauge(
    "gantry_queue_depth",
    "Queued jobs per tier, as of the latest dispatch tick.",
    ["tier"],
    multiprocess_mode="livemostrecent",
)
RECOVERED = Counter(
    "gantry_unclaimed_attempts_total",
    "Placed attempts not claimed by their worker: run message re-sent, or requeued.",
    ["action"],
)
QUEUE_OLDEST = Gauge(
    "gantry_queue_oldest_seconds",
    "Age of the oldest job waiting for GPUs per tier (backoff over), as of the latest "
    "dispatch tick; 0 when none waits.",
    ["tier"],
    multiprocess_mode="livemostrecent",
)
RUNNING_JOBS = Gauge(
    "gantry_running_jobs",
    "Attempts holding GPUs (placed, running or stopping) per GPU type and node, as of the "
    "latest dispatch tick.",
    ["gpu_type", "node"],
    multiprocess_mode="livemostrecent",
)
GPUS_BUSY = Gauge(
    "gantry_gpus_busy",
    "GPUs held by an attempt per GPU type and node, as of the latest dispatch tick.",
    ["gpu_type", "node"],
    multiprocess_mode="livemostrecent",
)
GPUS_TOTAL = Gauge(
    "gantry_gpus",
    "GPUs of nodes that are not down, per GPU type and node, as of the latest dispatch tick.",
    ["gpu_type", "node"],
    multiprocess_mode="livemostrecent",
)
PREEMPTED_JOBS = Counter(
    "gantry_preempted_jobs_total",
    "Running jobs asked to stop to make room for another, by the tier of the stopped job.",
    ["tier"],
)

# Label sets this process reported last time: a node that left the snapshot is set to 0
# rather than left at its last value.
_reported_fleet: set[tuple[str, str]] = set()
_report_lock = threading.Lock()


def report_tick(cluster, placed) -> None:
    """Set the queue-age and fleet gauges from a tick's snapshot and its applied placements.

    `cluster` is the policy's ClusterSnapshot as read before the decisions; `placed` the
    Place decisions that were applied this tick (their GPUs are busy now, their jobs no
    longer wait).
    """
    placed_jobs = {decision.job_id for decision in placed}
    oldest: dict[str, float] = {}
    for job in cluster.queued:
        if job.id not in placed_jobs:
            oldest[job.tier] = min(oldest.get(job.tier, job.submitted_at), job.submitted_at)
    for tier in TIERS:
        QUEUE_OLDEST.labels(tier).set(max(0.0, cluster.now - oldest[tier]) if tier in oldest else 0)

    type_of: dict = {}
    busy: dict[tuple[str, str], int] = {}
    total: dict[tuple[str, str], int] = {}
    running: dict[tuple[str, str], int] = {}
    for node in cluster.nodes:
        for gpu in node.gpus:
            key = (gpu.type, node.name)
            type_of[gpu.id] = gpu.type
            total[key] = total.get(key, 0) + 1
            busy[key] = busy.get(key, 0) + (0 if gpu.free else 1)
    for allocation in cluster.running:
        gpu_type = type_of.get(allocation.gpu_ids[0]) if allocation.gpu_ids else None
        if gpu_type is not None:
            key = (gpu_type, allocation.node)
            running[key] = running.get(key, 0) + 1
    for decision in placed:
        key = (decision.gpu_type, decision.node)
        busy[key] = busy.get(key, 0) + len(decision.gpu_ids)
        running[key] = running.get(key, 0) + 1
    with _report_lock:
        for key in _reported_fleet - total.keys():
            for gauge in (RUNNING_JOBS, GPUS_BUSY, GPUS_TOTAL):
                gauge.labels(*key).set(0)
        for key, count in total.items():
            GPUS_TOTAL.labels(*key).set(count)
            GPUS_BUSY.labels(*key).set(min(count, busy.get(key, 0)))
            RUNNING_JOBS.labels(*key).set(running.get(key, 0))
        _reported_fleet.clear()
        _reported_fleet.update(total)
