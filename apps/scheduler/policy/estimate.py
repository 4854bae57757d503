"""Start-time estimates and queue positions for the jobs a round leaves waiting.

A list schedule over GPU types: every GPU of an active node is free at some time (now if
free, else when its allocation is expected to end: its start plus `runtime_ratio` of its
max runtime, or the grace period for one that is stopping). The waiting jobs, in the
order the round served them (then the rest, highest tier and oldest first), each take
the `gpu_count` earliest-free GPUs of their best allowed type, and hold them for their
own expected runtime. Two corrections, each measured on the simulator's bursty runs:
- preemption: a job whose tier preempts starts, at the latest, once its preemption wait
  and the victims' grace are over, if enough preemptible lower-tier GPUs of its types
  are running (each counted for one job); it then leaves the GPUs that free up by
  themselves to the jobs after it;
- work yet to arrive: a tier's wait is stretched by 1 + the share of the fleet the tiers
  above it held lately (decayed usage), the GPUs that their later jobs will take first.
A job that cannot be preempted starts no sooner than its tier's ceiling has room for it
(`TierCeilings`). A job that no active node could hold on one node, or that can never
start on the fleet as it is (one that cannot be preempted and needs more than its tier's
ceiling), gets no estimate and holds no GPUs in the schedule. What it leaves out: that a
job's GPUs must be on one node (a multi-GPU job may start later than estimated) and
bursts (a sudden higher-tier burst pushes starts back). The simulator measures the error
against the actual starts.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence

from .config import TIER_RANK, TIERS
from .snapshot import Id, Node, NodeState, QueuedJob, RunningAllocation

# Beyond this many seconds an estimate says nothing useful: reported as unknown.
HORIZON_S = 7 * 24 * 3600.0

# The least share of its max runtime a job is expected to run. Tenants set generous
# limits: on `make up`, 10 s jobs with `max_runtime_s` 3600 ran 0.3 % of it, and a floor
# of 1 % expected 36 s each, every start estimate three and a half times too far. A
# thousandth still keeps an expected end after the start.
MIN_RUNTIME_RATIO = 0.001

# Finished attempts of a tier from which its start estimates use their median ratio.
# Fewer than the hold-back's ten: on a new one-GPU `make up`, five 10 s jobs under a
# 600 s limit read starts 10, 20 ... 50 minutes away (each queued job expected to run
# its whole limit) and started within 42 s.
ESTIMATE_MIN_SAMPLES = 3


def stretch_by_tier(held_above: Mapping[str, float], capacity: int) -> dict[str, float]:
    """tier -> how much longer its waits are than the list schedule says: 1 + ρ, where ρ
    is the share of the fleet the tiers ranked above it held lately (`held_above`:
    tier -> GPUs). The schedule hands the GPUs that free up to the jobs already waiting,
    but work of a higher tier that is yet to arrive takes its share of them first.
    Queueing theory's 1 / (1 − ρ) overshot on bursty load (a free job's estimate 2,089 s
    late at the median, against 325 s early without it), where the tiers above hold most
    of the fleet in bursts and little between them; 1 + ρ cut the error
    (docs/scheduler-experiments.md, "Start estimates that expect preemption and later
    arrivals").
    """
    if capacity <= 0:
        return {}
    return {tier: 1.0 + min(1.0, gpus / capacity) for tier, gpus in held_above.items()}


def observed_runtime_ratios(ratios: Iterable[float], *, min_samples: int) -> tuple[float, float]:
    """The typical (median) and the late (75th percentile) share of their max runtime
    that recently finished attempts ran, each within [`MIN_RUNTIME_RATIO`, 1] and interpolated as
    PostgreSQL's `percentile_cont`. From fewer than `min_samples` attempts, (1.0, 1.0): a
    job is expected to run its whole max runtime until enough have finished to say
    otherwise."""
    ordered = sorted(min(1.0, max(MIN_RUNTIME_RATIO, float(ratio))) for ratio in ratios)
    if not ordered or len(ordered) < min_samples:
        return 1.0, 1.0
    return _percentile(ordered, 0.5), _percentile(ordered, 0.75)


def observed_runtime_ratios_by_tier(
    ratios: Iterable[tuple[str, float]], *, min_samples: int
) -> dict[str, tuple[float, float]]:
    """tier -> `observed_runtime_ratios` of that tier's own (tier, ratio) samples, for
    every tier ((1.0, 1.0) for one with too few): `ClusterSnapshot.runtime_ratios_by_tier`,
    as the dispatch tick and the simulator both read it. The typical ratio, which only
    start estimates read, needs `ESTIMATE_MIN_SAMPLES` of them, and a tier with fewer
    takes the median of every tier's samples together (on a new platform the first paid
    jobs ran after a few enterprise ones: their own limit, ten minutes each, was a worse
    guess than what the other tier's jobs ran); the late one, which holds preemptions
    back, keeps `min_samples` of the tier's own."""
    by_tier: dict[str, list[float]] = {tier: [] for tier in TIERS}
    pooled: list[float] = []
    for tier, ratio in ratios:
        by_tier.setdefault(tier, []).append(ratio)
        pooled.append(ratio)
    estimate_min = min(min_samples, ESTIMATE_MIN_SAMPLES)
    pooled_typical, _ = observed_runtime_ratios(pooled, min_samples=estimate_min)
    result = {}
    for tier, sample in by_tier.items():
        typical, late = observed_runtime_ratios(sample, min_samples=min_samples)
        if len(sample) < estimate_min:
            typical = pooled_typical
        elif len(sample) < min_samples:
            typical, _ = observed_runtime_ratios(sample, min_samples=estimate_min)
        result[tier] = (typical, late)
    return result


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    position = fraction * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


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
    before `now`). The one expectation the estimates (at the median ratio) and the
    preemption hold-back (at the late one, `ClusterSnapshot.late_runtime_ratio`) share;
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
    runtime_ratio: Callable[[str], float],
    stop_delay_s: float,
) -> dict[str, list[float]]:
    """GPU type -> a min-heap of the times each GPU of that type is expected to be free.

    `placed`: GPU id -> expected end of a job placed on it in this round;
    `runtime_ratio`: tier -> the share of its max runtime a job of it is expected to run."""
    ends: dict[Id, float] = {}
    for allocation in running:
        end = typical_end(
            allocation,
            now=now,
            runtime_ratio=runtime_ratio(allocation.tier),
            stop_delay_s=stop_delay_s,
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


class Victims:
    """The estimates' view of preemption: the preemptible GPUs of each tier and type
    (running, not stopping, under the per-job preemption cap) that waiting jobs of
    higher tiers may take once their tier's preemption wait is over, each GPU counted
    for one job."""

    def __init__(
        self,
        held: Iterable[tuple[str, RunningAllocation]],
        *,
        now: float,
        waits: Mapping[str, float | None],
        grace_s: float,
        max_preemptions: int,
    ):
        """`held`: (GPU type, allocation) for each allocation running on the fleet;
        `waits`: tier -> how long its jobs wait before preempting (None: never)."""
        self._now, self._waits, self._grace_s = now, waits, grace_s
        self._gpus: dict[tuple[int, str], int] = {}  # (tier rank, GPU type) -> GPUs
        for gpu_type, allocation in held:
            if (
                allocation.stopping
                or not allocation.preemptible
                or allocation.preemptions >= max_preemptions
            ):
                continue
            key = (TIER_RANK.get(allocation.tier, 0), gpu_type)
            self._gpus[key] = self._gpus.get(key, 0) + allocation.gpu_count

    def take(self, job: QueuedJob, types: tuple[str, ...], *, before: float) -> float | None:
        """When preemption would start the job, if that is before `before` and enough
        GPUs of lower tiers run on the types it may use (on any nodes: a lower bound of
        what one node must hold): its preemption wait, the victims' grace and a tick.
        Those GPUs, lowest tiers first, are then taken; None takes nothing."""
        wait = self._waits.get(job.tier)
        if wait is None:
            return None
        at = max(self._now, job.submitted_at + wait) + self._grace_s + 1.0
        if at >= before:
            return None
        rank = TIER_RANK.get(job.tier, 0)
        usable = sorted(k for k, n in self._gpus.items() if n and k[0] < rank and k[1] in types)
        if sum(self._gpus[k] for k in usable) < job.gpu_count:
            return None
        wanted = job.gpu_count
        for key in usable:
            taken = min(wanted, self._gpus[key])
            self._gpus[key] -= taken
            wanted -= taken
            if not wanted:
                break
        return at


class TierCeilings:
    """The estimates' view of tier ceilings: a job that cannot be preempted starts only
    once its tier holds few enough GPUs for it to stay within its ceiling, when enough
    of the tier's GPUs have come back (each at its expected end). The jobs so estimated
    then hold their share of the ceiling until their own expected ends. Preemptible jobs
    are not held back (they borrow beyond the ceiling)."""

    def __init__(
        self, held: Callable[[], Iterable[tuple[str, float, int]]], kept: Mapping[str, int]
    ):
        """`held()`: (tier, expected end, GPUs) of each allocation running or placed this
        round, read only once a job that cannot be preempted asks (most rounds have
        none); `kept`: tier -> the whole GPUs its ceiling allows."""
        self._held, self._kept = held, kept
        self._ends_by_tier: dict[str, list[float]] | None = None

    @property
    def _ends(self) -> dict[str, list[float]]:
        if self._ends_by_tier is None:
            self._ends_by_tier = {}
            for tier, end, gpus in self._held():
                self._ends_by_tier.setdefault(tier, []).extend([end] * gpus)
            for ends in self._ends_by_tier.values():
                heapq.heapify(ends)
        return self._ends_by_tier

    def not_before(self, job: QueuedJob) -> float | None:
        """When the job's tier has room for it within its ceiling (None: room now). For
        a job its ceiling can hold at all (estimate leaves the others out first,
        `never_starts`): then enough of the tier's GPUs come back for it."""
        if job.preemptible:
            return None
        ends = self._ends.get(job.tier, [])
        over = len(ends) + job.gpu_count - self._kept.get(job.tier, 0)
        if over <= 0:
            return None
        return heapq.nsmallest(over, ends)[-1]

    def hold(self, job: QueuedJob, end: float) -> None:
        """The job holds its share of its tier's ceiling until `end`, in place of the
        GPUs whose return made room for it."""
        if job.preemptible:
            return
        ends = self._ends.setdefault(job.tier, [])
        for _ in range(max(0, len(ends) + job.gpu_count - self._kept.get(job.tier, 0))):
            heapq.heappop(ends)
        for _ in range(job.gpu_count):
            heapq.heappush(ends, end)


def estimate(
    jobs: Iterable[QueuedJob],
    heaps: dict[str, list[float]],
    allowed_types: Callable[[QueuedJob], tuple[str, ...]],
    *,
    now: float,
    runtime_ratio: Callable[[str], float],
    fits: Callable[[str, int], bool] | None = None,
    stretch: Mapping[str, float] | None = None,
    victims: Victims | None = None,
    never_starts: Callable[[QueuedJob], bool] | None = None,
    ceilings: TierCeilings | None = None,
) -> dict[Id, tuple[int | None, float | None]]:
    """job id -> (position among the jobs ahead that compete for a GPU type it may use,
    estimated start or None). `heaps` is consumed.

    `stretch` (tier -> factor, see stretch_by_tier) lengthens each tier's waits for the
    higher-tier work yet to come; the schedule itself is not stretched. A job that
    preemption would start sooner (`victims`) is estimated to start then and leaves the
    GPUs that free up by themselves to the jobs after it. `fits` (GPU type, count):
    whether some active node has that many GPUs of that type; a type that fails it is
    never estimated for the job, however many GPUs of it the fleet has in all, and a job
    that fails it on every type has neither a position nor an estimate, nor has one for
    which `never_starts` is true (it cannot start on this fleet for another reason). A
    job that cannot be preempted starts no sooner than its tier's ceiling has room for it
    (`ceilings`)."""
    stretch = stretch or {}
    result: dict[Id, tuple[int | None, float | None]] = {}
    ahead_by_types: dict[tuple[str, ...], int] = {}
    for job in jobs:
        types = allowed_types(job)
        fitting = types if fits is None else [t for t in types if fits(t, job.gpu_count)]
        if (types and not fitting) or (never_starts is not None and never_starts(job)):
            # It cannot start on this fleet: it stands nowhere, and ahead of no one.
            result[job.id] = (None, None)
            continue
        ahead = sum(
            count for other, count in ahead_by_types.items() if not types or set(other) & set(types)
        )
        ahead_by_types[types] = ahead_by_types.get(types, 0) + 1
        best_type, best_start = None, None
        for gpu_type in fitting:
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
        room = ceilings.not_before(job) if ceilings is not None else None
        if room is not None:
            best_start = max(best_start, room)
        start = now + max(0.0, best_start - now) * stretch.get(job.tier, 1.0)
        preempting = (
            victims.take(job, types, before=start) if victims is not None and room is None else None
        )
        if preempting is not None:
            result[job.id] = (ahead + 1, preempting)
            continue
        heap = heaps[best_type]
        end = best_start + runtime_ratio(job.tier) * job.max_runtime_s
        for _ in range(job.gpu_count):
            heapq.heapreplace(heap, end)
        if ceilings is not None:
            ceilings.hold(job, end)
        result[job.id] = (ahead + 1, start if start - now <= HORIZON_S else None)
    return result
