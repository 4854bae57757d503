"""Workloads: the jobs that arrive, with their true run times (unknown to the policy).

- `steady`: Poisson arrivals whose GPU-seconds add up to `overload` × the fleet (2x by
  default), 10 % enterprise, 30 % paid, 60 % free by demand; many orgs per tier with
  varied weights, each org's demand and number of users proportional to its weight;
  run times log-uniform between 20 s and 40 min; 1, 2, 4 or 8 GPUs skewed to small;
  varied GPU type preferences and memory floors; some jobs not preemptible.
- `flood`: `steady` plus one extra enterprise customer that submits `flood_jobs` jobs at
  one instant.
- `spike`: `steady` plus a burst during which arrivals run at `factor` × the steady rate.
- `bursty`: what a real generation service sees: short single-GPU requests (median 23 s,
  p99 about 2 min), thousands of small tenants with a handful of requests each and a
  few heavy ones, and demand that swings between nothing and about 4x the fleet within
  minutes; `load` sets the mean offered load.
- `trace`: a replay of a CSV in the neutral trace format (`submit_s,duration_s,
  gpu_count,gpu_types,tier,org,user,preemptible`).

Every random stream is seeded from `seed`, and the extra load of `flood` and `spike`
comes from separate streams, so with the same seed they contain exactly the jobs of
`steady` plus their extra jobs (the comparisons in the report rely on this).
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from apps.scheduler.policy import ENTERPRISE, FREE, PAID, TIERS, GpuType

# The share of a run not measured by default (the fleet fills up).
DEFAULT_WARMUP_SHARE = 0.15
TIER_DEMAND_SHARE = {ENTERPRISE: 0.10, PAID: 0.30, FREE: 0.60}
GPU_COUNT_WEIGHTS = {1: 0.55, 2: 0.20, 4: 0.15, 8: 0.10}
MIN_WORK_S, MAX_WORK_S = 20.0, 2400.0
PREEMPTIBLE_SHARE = {ENTERPRISE: 0.6, PAID: 0.85, FREE: 1.0}
CHECKPOINT_INTERVALS_S = (60.0, 120.0, 180.0, 300.0)
NEVER_CHECKPOINTS_SHARE = 0.15
ORG_WEIGHT_CYCLE = {ENTERPRISE: (1.0, 2.0, 4.0), PAID: (1.0, 1.0, 2.0, 3.0), FREE: (1.0, 1.0, 2.0)}
USERS_PER_ORG = {ENTERPRISE: (2, 4), PAID: (2, 4), FREE: (1, 3)}


@dataclass(slots=True)
class JobSpec:
    id: str
    submit_at: float
    tier: str
    org: str
    user: str
    gpu_count: int
    max_runtime_s: float
    work_s: float  # true run time; the policy only sees max_runtime_s
    gpu_types: tuple[str, ...] = ()
    min_gpu_memory_gb: float = 0.0
    preemptible: bool = True
    checkpoint_every_s: float | None = None  # None: never checkpoints
    tag: str = ""  # "flood" or "spike" for the extra load


@dataclass(frozen=True, slots=True)
class OrgSpec:
    name: str
    tier: str
    weight: float
    users: tuple[str, ...]


@dataclass(slots=True)
class Workload:
    name: str
    jobs: list[JobSpec]  # sorted by submit time
    orgs: list[OrgSpec]
    notes: list[str] = field(default_factory=list)
    flood_org: str | None = None
    flood_at: float | None = None

    @property
    def org_weights(self) -> dict[str, float]:
        return {org.name: org.weight for org in self.orgs}

    def offered_gpu_seconds(self, start: float = 0.0, end: float = math.inf) -> float:
        """GPU-seconds of work submitted in [start, end)."""
        return sum(job.gpu_count * job.work_s for job in self.jobs if start <= job.submit_at < end)

    def offered_load(self, total_gpus: int, start: float, end: float) -> float:
        """Work submitted in [start, end) over the fleet's GPU-seconds in it."""
        span = (end - start) * total_gpus
        return self.offered_gpu_seconds(start, end) / span if span > 0 else 0.0

    def fitted_to(self, largest_node: int) -> Workload:
        """Narrows, in place, each job to at most `largest_node` GPUs (a job no node can
        hold would wait for ever) and says in the notes how many; returns the workload."""
        narrowed = 0
        for job in self.jobs:
            if job.gpu_count > largest_node:
                job.gpu_count = largest_node
                narrowed += 1
        if narrowed:
            self.notes.append(
                f"{narrowed} jobs asking for more GPUs than the largest node ({largest_node}) "
                f"given {largest_node}"
            )
        return self


def mean_gpu_seconds_per_job() -> float:
    mean_gpus = sum(count * weight for count, weight in GPU_COUNT_WEIGHTS.items())
    mean_work = (MAX_WORK_S - MIN_WORK_S) / math.log(MAX_WORK_S / MIN_WORK_S)  # log-uniform
    return mean_gpus * mean_work


def make_orgs(total_gpus: int, seed: int) -> list[OrgSpec]:
    """Orgs per tier scale with the fleet (1,000 GPUs: 8 enterprise, 20 paid, 50 free)."""
    rng = random.Random(f"orgs-{seed}")
    counts = {
        ENTERPRISE: max(2, total_gpus // 125),
        PAID: max(3, total_gpus // 50),
        FREE: max(4, total_gpus // 20),
    }
    orgs = []
    for tier in (ENTERPRISE, PAID, FREE):
        cycle = ORG_WEIGHT_CYCLE[tier]
        low, high = USERS_PER_ORG[tier]
        for i in range(counts[tier]):
            name = f"{tier[:3]}-{i:03d}"
            weight = cycle[i % len(cycle)]
            # Bigger customers (higher weight) have proportionally more users, so the
            # per-user queue quota does not cap them below their share.
            users = tuple(f"{name}-u{u}" for u in range(round(weight * rng.randint(low, high))))
            orgs.append(OrgSpec(name=name, tier=tier, weight=weight, users=users))
    return orgs


class _JobFactory:
    """Draws job shapes; GPU type preferences are derived from the fleet's types."""

    def __init__(self, gpu_types: Sequence[GpuType], rng: random.Random):
        self.rng = rng
        by_price = sorted(gpu_types, key=lambda t: (-t.price_per_gpu_hour, t.name))
        names = tuple(t.name for t in by_price)
        top_memory = max(t.memory_gb for t in gpu_types)
        # (weight, allowed types most preferred first, memory floor)
        self.type_choices = [
            (0.40, (), 0.0),  # anything (cheapest first)
            (0.25, names, 0.0),  # prefers the premium type, takes any
            (0.15, tuple(reversed(names)), 0.0),  # prefers the cheaper type, takes any
            (0.10, names[:1], 0.0),  # premium type only
            (0.10, (), float(top_memory)),  # needs the largest memory
        ]
        self._counts = list(GPU_COUNT_WEIGHTS)
        self._count_weights = list(GPU_COUNT_WEIGHTS.values())

    def job(self, job_id: str, submit_at: float, org: OrgSpec, tag: str = "") -> JobSpec:
        rng = self.rng
        work = math.exp(rng.uniform(math.log(MIN_WORK_S), math.log(MAX_WORK_S)))
        max_runtime = math.ceil(work * rng.uniform(1.1, 2.0) / 10.0) * 10.0
        weights = [c[0] for c in self.type_choices]
        _, types, memory = rng.choices(self.type_choices, weights=weights)[0]
        never = rng.random() < NEVER_CHECKPOINTS_SHARE
        return JobSpec(
            id=job_id,
            submit_at=submit_at,
            tier=org.tier,
            org=org.name,
            user=rng.choice(org.users),
            gpu_count=rng.choices(self._counts, weights=self._count_weights)[0],
            max_runtime_s=max_runtime,
            work_s=work,
            gpu_types=types,
            min_gpu_memory_gb=memory,
            preemptible=rng.random() < PREEMPTIBLE_SHARE[org.tier],
            checkpoint_every_s=None if never else rng.choice(CHECKPOINT_INTERVALS_S),
            tag=tag,
        )


def _poisson_times(rng: random.Random, rate: float, start: float, end: float) -> Iterator[float]:
    t = start
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= end:
            return
        yield t


def steady(
    gpu_types: Sequence[GpuType],
    total_gpus: int,
    duration_s: float,
    seed: int,
    overload: float = 2.0,
    orgs: list[OrgSpec] | None = None,
) -> Workload:
    orgs = orgs or make_orgs(total_gpus, seed)
    demand_gpus = overload * total_gpus  # GPUs' worth of work arriving per second
    per_job = mean_gpu_seconds_per_job()
    jobs: list[JobSpec] = []
    for org in orgs:
        tier_weight = sum(o.weight for o in orgs if o.tier == org.tier)
        rate = demand_gpus * TIER_DEMAND_SHARE[org.tier] * org.weight / tier_weight / per_job
        rng = random.Random(f"steady-{seed}-{org.name}")
        factory = _JobFactory(gpu_types, rng)
        for i, t in enumerate(_poisson_times(rng, rate, 0.0, duration_s)):
            jobs.append(factory.job(f"{org.name}-j{i}", t, org))
    jobs.sort(key=lambda j: (j.submit_at, j.id))
    notes = [
        f"steady overload: offered demand {overload:g}x the fleet "
        + ", ".join(f"{t} {TIER_DEMAND_SHARE[t]:.0%}" for t in (ENTERPRISE, PAID, FREE)),
    ]
    return Workload(name="steady", jobs=jobs, orgs=list(orgs), notes=notes)


def flood(
    gpu_types: Sequence[GpuType],
    total_gpus: int,
    duration_s: float,
    seed: int,
    flood_jobs: int = 10_000,
    flood_at: float | None = None,
    overload: float = 2.0,
) -> Workload:
    base = steady(gpu_types, total_gpus, duration_s, seed, overload)
    flood_at = 0.2 * duration_s if flood_at is None else flood_at
    flooder = OrgSpec(name="ent-flood", tier=ENTERPRISE, weight=1.0, users=("ent-flood-u0",))
    factory = _JobFactory(gpu_types, random.Random(f"flood-{seed}"))
    extra = [factory.job(f"flood-j{i}", flood_at, flooder, tag="flood") for i in range(flood_jobs)]
    jobs = sorted(base.jobs + extra, key=lambda j: (j.submit_at, j.id))
    notes = [
        *base.notes,
        f"flood: {flood_jobs} enterprise jobs from {flooder.name} at t={flood_at:.0f} s",
    ]
    return Workload(
        name="flood",
        jobs=jobs,
        orgs=[*base.orgs, flooder],
        notes=notes,
        flood_org=flooder.name,
        flood_at=flood_at,
    )


def spike(
    gpu_types: Sequence[GpuType],
    total_gpus: int,
    duration_s: float,
    seed: int,
    factor: float = 10.0,
    start: float | None = None,
    length_s: float | None = None,
    overload: float = 2.0,
) -> Workload:
    """Steady load, and for `length_s` from `start` arrivals at `factor` x the steady rate."""
    base = steady(gpu_types, total_gpus, duration_s, seed, overload)
    start = 0.4 * duration_s if start is None else start
    length_s = min(300.0, 0.1 * duration_s) if length_s is None else length_s
    extra_rate_factor = factor - 1.0
    per_job = mean_gpu_seconds_per_job()
    extra: list[JobSpec] = []
    for org in base.orgs:
        tier_weight = sum(o.weight for o in base.orgs if o.tier == org.tier)
        rate = (
            overload
            * total_gpus
            * TIER_DEMAND_SHARE[org.tier]
            * org.weight
            / tier_weight
            / per_job
            * extra_rate_factor
        )
        rng = random.Random(f"spike-{seed}-{org.name}")
        factory = _JobFactory(gpu_types, rng)
        for i, t in enumerate(_poisson_times(rng, rate, start, start + length_s)):
            extra.append(factory.job(f"{org.name}-s{i}", t, org, tag="spike"))
    jobs = sorted(base.jobs + extra, key=lambda j: (j.submit_at, j.id))
    notes = [
        *base.notes,
        f"spike: arrivals at {factor:g}x the steady rate for {length_s:.0f} s from t={start:.0f} s "
        f"({len(extra)} extra jobs)",
    ]
    return Workload(name="spike", jobs=jobs, orgs=base.orgs, notes=notes)


TRACE_COLUMNS = (
    "submit_s",
    "duration_s",
    "gpu_count",
    "gpu_types",
    "tier",
    "org",
    "user",
    "preemptible",
    "checkpoint_every_s",
)
# A trace says nothing of checkpoints: unless a row's `checkpoint_every_s` or the replay's
# option says otherwise, its preemptible jobs checkpoint every 5 minutes (so the short
# requests of a generation service never do, and a preemption loses all their progress).
TRACE_CHECKPOINT_EVERY_S = 300.0
_TRUE = frozenset({"true", "t", "yes", "y", "1"})


def _trace_rows(path: str | Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a trace CSV, names and values stripped, names lower-cased
    (a byte-order mark dropped). Only `submit_s` and `duration_s` are required. Fields
    are separated by commas, or by tabs or semicolons if the header has no comma."""
    with open(path, newline="", encoding="utf-8-sig") as handle:
        header = handle.readline()
        handle.seek(0)
        delimiter = next((d for d in (",", "\t", ";") if d in header), ",")
        reader = csv.DictReader(handle, delimiter=delimiter)
        if not reader.fieldnames:
            raise ValueError(f"{path}: empty; expected the columns {','.join(TRACE_COLUMNS)}")
        reader.fieldnames = [(name or "").strip().lower() for name in reader.fieldnames]
        missing = {"submit_s", "duration_s"} - set(reader.fieldnames)
        if missing:
            raise ValueError(
                f"{path}: no column {', '.join(sorted(missing))}; expected "
                f"{','.join(TRACE_COLUMNS)} (all but submit_s and duration_s optional)"
            )
        for line, row in enumerate(reader, start=2):
            yield line, {k: (v or "").strip() for k, v in row.items() if isinstance(v, str)}


def trace_gpu_types(path: str | Path) -> list[str]:
    """The GPU models a trace CSV names, in order of first appearance."""
    names: dict[str, None] = {}
    for _line, row in _trace_rows(path):
        for name in row.get("gpu_types", "").split("|"):
            if name.strip():
                names.setdefault(name.strip(), None)
    return list(names)


def _trace_job(
    row: dict[str, str],
) -> tuple[float, float, int, str, bool, bool, float | None] | None:
    """(submit, duration, GPUs, tier, preemptible, rounded up, checkpoint interval) of a
    row; None if a value is unusable. Defaults for absent columns: 1 GPU, tier paid,
    preemptible only in the free tier, the replay's checkpoint interval (returned as
    None; a row's 0 means it never checkpoints, returned as 0.0). A fraction of a GPU (a
    GPU-sharing cluster's request, 0.25 or 1.5) asks for whole GPUs here, as Gantry
    allocates them: rounded up."""
    try:
        submit, duration = float(row["submit_s"]), float(row["duration_s"])
        gpus = float(row.get("gpu_count") or 1)
        checkpoint = float(row["checkpoint_every_s"]) if row.get("checkpoint_every_s") else None
    except ValueError:
        return None
    tier = (row.get("tier") or PAID).lower()
    if not (math.isfinite(submit) and math.isfinite(duration)) or tier not in TIERS:
        return None
    if not (math.isfinite(gpus) and gpus > 0):
        return None  # not a GPU job
    if checkpoint is not None and not (math.isfinite(checkpoint) and checkpoint >= 0):
        return None
    whole = math.ceil(gpus)
    flag = row.get("preemptible", "")
    preemptible = flag.lower() in _TRUE if flag else tier == FREE
    return submit, duration, whole, tier, preemptible, whole != gpus, checkpoint


def trace(
    path: str | Path,
    gpu_types: Sequence[GpuType],
    duration_s: float,
    speedup: float | None = None,
    max_work_s: float = 3600.0,
    max_gpus_per_job: int | None = None,
    checkpoint_every_s: float | None = TRACE_CHECKPOINT_EVERY_S,
) -> Workload:
    """Replay a trace CSV (`submit_s,duration_s,gpu_count,gpu_types,tier,org,user,
    preemptible[,checkpoint_every_s]`; see `_trace_job` for absent columns).

    Submit times are divided by `speedup` (default: the whole trace fits `duration_s`,
    every row kept; a given `speedup` leaves out, and counts, the rows it puts after
    the window); run times are kept but capped at `max_work_s`; the declared max
    runtime is 1.5x the (capped) run time; preemptible jobs checkpoint every
    `checkpoint_every_s` of progress (None: never), unless their row gives its own.
    Rows whose GPU types are unknown to the fleet keep only the known ones (dropped if
    none is left); rows asking for more GPUs than a node has (`max_gpus_per_job`), and
    rows with a value that is not a number, a known tier or a positive GPU count, are
    dropped; fractional GPU counts are rounded up; the notes count each.

    A Gantry org has one tier, but the trace's synthetic orgs mix QoS classes, so each
    (org, tier) pair becomes its own org, named like `org-16.ent`."""
    known = {t.name for t in gpu_types}
    rows, unusable = [], []
    for line, row in _trace_rows(path):
        parsed = _trace_job(row)
        if parsed is None:
            unusable.append(line)
        else:
            rows.append((line, row, *parsed))
    if not rows:
        raise ValueError(
            f"{path}: no usable rows"
            + (f" (line {unusable[0]} is the first unusable one)" if unusable else "")
        )
    first = min(r[2] for r in rows)
    span = max(r[2] for r in rows) - first
    fitted = speedup is None
    if fitted:
        speedup = max(1.0, span / duration_s) if span > 0 else 1.0
    jobs: list[JobSpec] = []
    orgs: dict[str, set[str]] = {}
    org_tier: dict[str, str] = {}
    dropped = too_large = rounded = after_window = own_checkpoints = 0
    for line, row, submitted, duration, gpu_count, tier, preemptible, fraction, every in rows:
        submit = (submitted - first) / speedup
        if fitted:
            # The span fits the window by construction: the rounding of the division
            # must not push the last rows out of it.
            submit = min(submit, duration_s)
        elif submit > duration_s:
            after_window += 1
            continue
        names = (t.strip() for t in row.get("gpu_types", "").split("|"))
        types = tuple(dict.fromkeys(t for t in names if t))
        if types and not any(t in known for t in types):
            dropped += 1
            continue
        if max_gpus_per_job is not None and gpu_count > max_gpus_per_job:
            too_large += 1
            continue
        types = tuple(t for t in types if t in known)
        rounded += fraction
        work = max(1.0, min(duration, max_work_s))
        own_checkpoints += every is not None and preemptible
        every = checkpoint_every_s if every is None else every or None
        org = f"{row.get('org') or 'org'}.{tier[:3]}"
        orgs.setdefault(org, set()).add(row.get("user") or org)
        org_tier[org] = tier
        jobs.append(
            JobSpec(
                id=f"t{line - 2}",  # the row's index in the file
                submit_at=submit,
                tier=tier,
                org=org,
                user=row.get("user") or org,
                gpu_count=gpu_count,
                max_runtime_s=math.ceil(work * 1.5),
                work_s=work,
                gpu_types=types,
                preemptible=preemptible,
                checkpoint_every_s=every if preemptible else None,
            )
        )
    jobs.sort(key=lambda j: (j.submit_at, j.id))
    org_specs = [
        OrgSpec(name=name, tier=org_tier[name], weight=1.0, users=tuple(sorted(users)))
        for name, users in sorted(orgs.items())
    ]
    notes = [
        f"trace {Path(path).name}: {len(jobs)} jobs, time compressed {speedup:.4g}x, run "
        f"times capped at {max_work_s:.0f} s, preemptible jobs "
        + (
            f"checkpoint every {checkpoint_every_s:g} s"
            if checkpoint_every_s
            else "never checkpoint"
        )
        + (f" ({own_checkpoints} with an interval of their own)" if own_checkpoints else "")
        + (f", {after_window} rows after the window left out" if after_window else "")
        + (f", {dropped} rows dropped (GPU types not in the fleet)" if dropped else "")
        + (f", {too_large} dropped (more GPUs than a node has)" if too_large else "")
        + (f", {rounded} asking for a fraction of a GPU given whole ones" if rounded else "")
        + (
            f", {len(unusable)} unusable rows skipped (first: line {unusable[0]})"
            if unusable
            else ""
        ),
    ]
    return Workload(name="trace", jobs=jobs, orgs=org_specs, notes=notes)


# The bursty scenario: request shape and tenants (a replay of short generation requests).
BURSTY_MEDIAN_WORK_S = 23.0
BURSTY_SIGMA = 0.71  # log-normal: p99 = median * e^(2.33 sigma) ≈ 2 min
BURSTY_TIER_ORGS = {ENTERPRISE: 0.03, PAID: 0.22, FREE: 0.75}  # share of the tenants
BURSTY_TIER_DEMAND = {ENTERPRISE: 0.15, PAID: 0.35, FREE: 0.50}  # share of the work
BURSTY_HEAVY_ORGS = 6  # a few tenants send a large part of their tier's work
BURSTY_HEAVY_SHARE = 0.4
BURSTY_PREEMPTIBLE = {ENTERPRISE: 0.7, PAID: 0.9, FREE: 1.0}
BURSTY_MAX_LEVEL = 4.0  # demand peaks at about 4x the fleet
BURSTY_TWO_GPU_SHARE = 0.05
BURSTY_MEAN_WORK_S = BURSTY_MEDIAN_WORK_S * math.exp(BURSTY_SIGMA**2 / 2)  # log-normal mean
BURSTY_MEAN_GPUS = (1 - BURSTY_TWO_GPU_SHARE) * 1 + BURSTY_TWO_GPU_SHARE * 2


DEFAULT_DURATION_S = 3600.0
# Bursty's default run holds about this many requests: an hour on small fleets, less on
# large ones (1,000 GPUs at 2x submit about 70 a second), where a replay of the whole hour
# would take most of an hour of CPU and the percentiles settle long before.
BURSTY_DEFAULT_REQUESTS = 60_000


def bursty_default_duration_s(total_gpus: int, load: float) -> float:
    """An hour, or the whole 5 minutes in which about BURSTY_DEFAULT_REQUESTS requests
    arrive at `load` × `total_gpus`, whichever is shorter (at least 5 minutes)."""
    per_second = load * total_gpus / (BURSTY_MEAN_WORK_S * BURSTY_MEAN_GPUS)
    if per_second <= 0:
        return DEFAULT_DURATION_S
    whole = math.floor(BURSTY_DEFAULT_REQUESTS / per_second / 300.0) * 300.0
    return min(DEFAULT_DURATION_S, max(300.0, whole))


def bursty(
    gpu_types: Sequence[GpuType],
    total_gpus: int,
    duration_s: float,
    seed: int,
    load: float = 1.0,
) -> Workload:
    """Bursts of short requests from many small tenants (see the module docstring).

    Demand follows segments of 1 to 8 minutes, each at a level drawn between 0 and
    BURSTY_MAX_LEVEL (a quarter of them quiet, but no quiet start that outlasts the
    warm-up, 15 % of the run), and the arrival rate is scaled so that the mean offered
    load is `load` × the fleet."""
    rng = random.Random(f"bursty-{seed}")
    tenants = max(200, min(4000, 4 * total_gpus))
    orgs: list[OrgSpec] = []
    for tier in (ENTERPRISE, PAID, FREE):
        for i in range(max(2, round(tenants * BURSTY_TIER_ORGS[tier]))):
            name = f"{tier[:3]}-{i:04d}"
            orgs.append(OrgSpec(name=name, tier=tier, weight=1.0, users=(f"{name}-u0",)))
    # Demand: segments of random length and level, mean 1 before scaling.
    segments, t = [], 0.0
    while t < duration_s:
        length = rng.uniform(60.0, 480.0)
        level = 0.0 if rng.random() < 0.25 else rng.uniform(0.2, BURSTY_MAX_LEVEL)
        if (
            not level
            and t + length >= DEFAULT_WARMUP_SHARE * duration_s
            and not any(seg[2] for seg in segments)
        ):
            continue  # a quiet start would leave the warm-up empty: draw another
        segments.append((t, min(duration_s, t + length), level))
        t += length
    # Normalised over the measured window (after the default 15 % warm-up).
    measured = DEFAULT_WARMUP_SHARE * duration_s
    mean_level = sum(
        (end - max(start, measured)) * level for start, end, level in segments if end > measured
    ) / (duration_s - measured)
    # jobs per second at level 1 that offer `load` × the fleet on average
    unit_rate = load * total_gpus / (BURSTY_MEAN_WORK_S * BURSTY_MEAN_GPUS) / max(mean_level, 1e-9)
    by_tier = {tier: [o for o in orgs if o.tier == tier] for tier in TIERS}
    heavy = {tier: by_tier[tier][: max(1, BURSTY_HEAVY_ORGS // 3)] for tier in TIERS}
    names = [t.name for t in sorted(gpu_types, key=lambda t: (-t.price_per_gpu_hour, t.name))]
    jobs: list[JobSpec] = []
    for start, end, level in segments:
        for submit in _poisson_times(rng, unit_rate * level, start, end):
            tier = rng.choices(TIERS, weights=[BURSTY_TIER_DEMAND[x] for x in TIERS])[0]
            pool = heavy[tier] if rng.random() < BURSTY_HEAVY_SHARE else by_tier[tier]
            org = rng.choice(pool)
            work = max(1.0, BURSTY_MEDIAN_WORK_S * math.exp(rng.gauss(0.0, BURSTY_SIGMA)))
            preemptible = rng.random() < BURSTY_PREEMPTIBLE[tier]
            jobs.append(
                JobSpec(
                    id=f"b{len(jobs)}",
                    submit_at=submit,
                    tier=tier,
                    org=org.name,
                    user=org.users[0],
                    gpu_count=2 if rng.random() < BURSTY_TWO_GPU_SHARE else 1,
                    max_runtime_s=max(60.0, math.ceil(work * rng.uniform(1.5, 4.0))),
                    work_s=work,
                    gpu_types=tuple(names[:1]) if rng.random() < 0.2 else (),
                    preemptible=preemptible,
                    checkpoint_every_s=10.0 if preemptible and rng.random() < 0.5 else None,
                )
            )
    jobs.sort(key=lambda j: (j.submit_at, j.id))
    notes = [
        f"bursty: {len(jobs)} short requests (median {BURSTY_MEDIAN_WORK_S:.0f} s) from "
        f"{len(orgs)} tenants, demand in segments of 1-8 min between 0 and "
        f"~{BURSTY_MAX_LEVEL:g}x the fleet, scaled to a mean of {load:g}x"
    ]
    return Workload(name="bursty", jobs=jobs, orgs=orgs, notes=notes)
