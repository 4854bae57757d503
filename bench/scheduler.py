"""Benchmark of the scheduling policy: decisions per second on a big fleet and queue.

    python bench/scheduler.py [--nodes 2000] [--queued 10000 30000 100000] [--repeat 3]

Builds one fleet of `--nodes` nodes of 8 GPUs (40 % H100, 60 % A100), about half of its
GPUs (`--busy`) held by running jobs of all tiers — a round with thousands of decisions
to make, as after a burst of completions or a restart — and queues of each size (1,000
orgs of 5 users, tiers 10/30/60 %, 1-8 GPUs, mixed type preferences, submitted over the
last hour so that preemption thresholds have passed). Each queue becomes the snapshot
the dispatcher would read for it: the policy's queue window (`queue_window`: 2,048 jobs
shared max-min between users, at least each user's first 4, so at most 4 of each of the
5,000 users here) plus the backlog of the other jobs per (tier, org) — built outside
the timed round, as PostgreSQL builds it. Each snapshot is scheduled `--repeat` times
from scratch (one dispatch round, the same `schedule` the tick calls), the sizes taking
turns; the median (and the best) is reported. Times are CPU time of this process
(`time.process_time`), so other processes do not inflate them much; on an idle machine
wall time is the same. The garbage collector is on, as in the dispatcher (`schedule`
pauses its cyclic collection during a round).

- decisions (Place / Preempt / Reserve) and decisions per second;
- the time per decision, and how it grows from the smallest to the largest queue
  against log(n) growth — the baseline of the ratio is the smallest queue, measured in
  the same run;
- the split between the one pass that reads the snapshot (the fleet index and the
  fair-share queue: linear in nodes and listed jobs, once per round) and the decision
  phase (per decision: heaps and sorted containers, no scan of the queue).

A last round has the fleet completely full and nobody entitled to preempt yet: it shows
the early exit.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import add_cpus_argument, begin_run

from apps.scheduler.policy import (
    TIERS,
    CapacityIndex,
    FairShareQueue,
    PolicyConfig,
    RunningGpus,
    UsageSnapshot,
    queue_window,
    schedule,
    schedule_round,
)
from apps.scheduler.policy.builders import allocation, job, node, snapshot

NOW = 1_000_000.0
TIER_MIX = (("enterprise", 0.1), ("paid", 0.3), ("free", 0.6))
SIZES = ((1, 0.55), (2, 0.2), (4, 0.15), (8, 0.1))
TYPE_CHOICES = ((), ("H100", "A100"), ("A100", "H100"), ("H100",), ("A100",))


def build_fleet(node_count: int, busy_share: float, seed: int):
    rng = random.Random(f"fleet-{seed}")
    fleet = [
        node(f"n{i:05d}", "H100" if i < node_count * 0.4 else "A100", gpus=8)
        for i in range(node_count)
    ]
    running = []
    for on in fleet:
        used = 0
        target = round(8 * busy_share + rng.uniform(-2, 2))
        while used < min(8, target):
            size = min(rng.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0], 8 - used)
            tier = rng.choices([t for t, _ in TIER_MIX], [w for _, w in TIER_MIX])[0]
            org = f"{tier[:3]}-{rng.randrange(round(1000 * dict(TIER_MIX)[tier])):04d}"
            started = NOW - rng.uniform(0, 3600)
            running.append(
                allocation(
                    f"a-{on.name}-{used}",
                    on,
                    range(used, used + size),
                    tier=tier,
                    org=org,
                    user=f"{org}-u{rng.randrange(5)}",
                    started_at=started,
                    max_runtime_s=rng.uniform(600, 7200),
                    preemptible=rng.random() < 0.85,
                    last_checkpoint_at=started + rng.uniform(0, NOW - started),
                )
            )
            used += size
    return fleet, running


def build_queue(size: int, seed: int):
    rng = random.Random(f"queue-{seed}")
    orgs_per_tier = {tier: round(1000 * share) for tier, share in TIER_MIX}
    queue = []
    for i in range(size):
        tier = rng.choices([t for t, _ in TIER_MIX], [w for _, w in TIER_MIX])[0]
        org = f"{tier[:3]}-{rng.randrange(orgs_per_tier[tier]):04d}"
        queue.append(
            job(
                f"q{i}",
                tier=tier,
                org=org,
                user=f"{org}-u{rng.randrange(5)}",
                gpus=rng.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0],
                submitted_at=NOW - rng.uniform(0, 3600),
                max_runtime_s=rng.uniform(60, 4800),
                types=rng.choice(TYPE_CHOICES),
                min_memory_gb=80.0 if rng.random() < 0.1 else 0.0,
            )
        )
    # Oldest first, as the dispatcher reads the queue (ORDER BY submission time).
    queue.sort(key=lambda queued: (queued.submitted_at, queued.id))
    weights = {}
    for tier, count in orgs_per_tier.items():
        for n in range(count):
            weights[f"{tier[:3]}-{n:04d}"] = rng.choice([1.0, 1.0, 2.0, 4.0])
    usage = UsageSnapshot(
        by_tier={t: rng.uniform(1e6, 1e7) for t in TIERS},
        by_org={org: rng.uniform(0, 2e5) for org in weights},
    )
    return queue, weights, usage


def windowed_snapshot(fleet, queue, running, config, weights, usage):
    """The snapshot the dispatcher reads for this queue: the policy's queue window (each
    user's first jobs, `window_depth` of them) and, per (tier, org), the backlog of the
    others — what the dispatcher's SQL returns (`apps.scheduler.services.snapshot`) and
    what the simulator lists. Built outside the timed round, as PostgreSQL builds it."""
    window = queue_window(queue, config)
    return snapshot(
        fleet,
        window.listed,
        running,
        now=NOW,
        config=config,
        org_weights=weights,
        usage=usage,
        backlog=window.backlog,
    )


def time_rounds(snaps: dict, repeat: int) -> dict:
    """Per snapshot: CPU seconds of each whole round, and of its read part (the fleet
    index and the fair-share queue built from the snapshot, timed apart).

    The snapshots take turns, round after round, so that a slow spell of a shared
    machine hits every queue size alike; each round starts after a full collection."""
    clock = time.process_time
    timings = {
        key: {"totals": [], "explained": [], "indexes": [], "queues": [], "decisions": []}
        for key in snaps
    }
    for _ in range(repeat):
        for key, snap in snaps.items():
            timing = timings[key]
            gc.collect()
            began = clock()
            timing["decisions"] = schedule(snap)
            timing["totals"].append(clock() - began)

            # What the dispatch tick runs: the round, and why each other job waits,
            # its position and its estimated start.
            gc.collect()
            began = clock()
            schedule_round(snap, explain=True)
            timing["explained"].append(clock() - began)

            gc.collect()
            gc.disable()  # as inside `schedule`
            began = clock()
            CapacityIndex(snap.nodes, snap.running, snap.gpu_types, snap.now, 5.0)
            timing["indexes"].append(clock() - began)
            running = RunningGpus.of(snap.running)
            began = clock()
            FairShareQueue(
                snap.queued,
                capacity_gpus=8 * len(snap.nodes),
                config=snap.config,
                org_weights=snap.org_weights,
                usage=snap.usage,
                running=running,
                now=snap.now,
                backlog=snap.backlog,
            )
            timing["queues"].append(clock() - began)
            gc.enable()
    return {
        key: {
            "median": statistics.median(t["totals"]),
            "explained": statistics.median(t["explained"]),
            "best": min(t["totals"]),
            "read": statistics.median(t["indexes"]) + statistics.median(t["queues"]),
            "queue_read": statistics.median(t["queues"]),
            "decisions": t["decisions"],
        }
        for key, t in timings.items()
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--queued", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--busy", type=float, default=0.5, help="share of GPUs held")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7)
    defaults = PolicyConfig()
    parser.add_argument(
        "--depth",
        type=int,
        default=defaults.queue_depth_per_user,
        help="queue_depth_per_user: jobs of each user a round looks at, at least",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=defaults.queue_window_jobs,
        help="queue_window_jobs: jobs a round looks at, shared max-min between users",
    )
    add_cpus_argument(parser)
    args = parser.parse_args(argv)
    begin_run(
        "bench/scheduler.py", args.cpus, started_here="none (the policy runs in this process)"
    )

    config = PolicyConfig(queue_depth_per_user=args.depth, queue_window_jobs=args.window)
    fleet, running = build_fleet(args.nodes, busy_share=args.busy, seed=args.seed)
    free = sum(gpu.free for n in fleet for gpu in n.gpus)
    print(
        f"fleet: {args.nodes} nodes x 8 GPUs = {8 * args.nodes} GPUs, {len(running)} running "
        f"allocations, {free} GPUs free; queue window {args.window} jobs, at least "
        f"{args.depth} per user; Python {sys.version.split()[0]}"
    )
    snaps = {}
    for size in sorted(args.queued):
        queue, weights, usage = build_queue(size, args.seed)
        snaps[size] = windowed_snapshot(fleet, queue, running, config, weights, usage)
        del queue  # the dispatcher holds only what it read
    full = [
        node(f"f{i:05d}", "H100" if i < args.nodes * 0.4 else "A100") for i in range(args.nodes)
    ]
    held = [allocation(f"full-{n.name}", n, range(8), tier="free", org="fre-0000") for n in full]
    queue, weights, usage = build_queue(max(args.queued), args.seed)
    for queued in queue:
        queued.submitted_at = NOW  # nobody has waited long enough to preempt yet
    snaps["full"] = windowed_snapshot(full, queue, held, config, weights, usage)
    del queue

    timings = time_rounds(snaps, args.repeat)
    print(
        f"{'queued':>8} {'listed':>7} {'place':>6} {'preempt':>7} {'reserve':>7} {'round ms':>9} "
        f"{'decisions/s':>11} {'best':>7} {'µs/decision':>11} {'read ms':>8} "
        f"{'µs/listed job read':>18} {'µs/decision after read':>23} {'round+explain ms':>16}"
    )
    rows = []
    for size in sorted(args.queued):
        snap, timing = snaps[size], timings[size]
        kinds = Counter(type(d).__name__ for d in timing["decisions"])
        count = max(1, len(timing["decisions"]))
        total = timing["median"]
        decide = max(0.0, total - timing["read"])
        rows.append((size, total / count, decide / count))
        print(
            f"{size:>8,} {len(snap.queued):>7,} {kinds['Place']:>6} {kinds['Preempt']:>7} "
            f"{kinds['Reserve']:>7} "
            f"{total * 1e3:>9.1f} {count / total:>11,.0f} {count / timing['best']:>7,.0f} "
            f"{total / count * 1e6:>11.1f} {timing['read'] * 1e3:>8.1f} "
            f"{timing['queue_read'] / len(snap.queued) * 1e6:>18.2f} "
            f"{decide / count * 1e6:>23.1f} {timing['explained'] * 1e3:>16.1f}"
        )
    if len(rows) > 1:
        (small, small_total, small_decide), (large, large_total, large_decide) = rows[0], rows[-1]
        print(
            f"growth {small:,} -> {large:,} queued (baseline: the {small:,} row above): "
            f"time per decision x{large_total / small_total:.2f} (whole round), "
            f"x{large_decide / small_decide:.2f} (after reading the snapshot); "
            f"log n grows x{math.log(large) / math.log(small):.2f}, n grows x{large / small:.0f}"
        )
    timing = timings["full"]
    print(
        f"full fleet, {max(args.queued):,} queued ({len(snaps['full'].queued):,} listed), nobody "
        f"past a preemption threshold: {len(timing['decisions'])} decisions in "
        f"{timing['median'] * 1e3:.1f} ms (early exit)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
