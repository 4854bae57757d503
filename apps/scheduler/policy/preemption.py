"""Victim selection and the fair entitlements that decide who may preempt.

A waiting job may preempt only when all of these hold (checked by the policy):

- its tier has a preemption threshold and the job has waited at least that long;
- it cannot be placed now, nor will it fit by itself within the victims' grace period;
- its org holds (counting GPUs already being freed for it) less than its *entitlement*:
  the max-min fair share of the fleet by weights (tier, then org), given what everyone
  currently holds and queues. Preemption restores fair share; an org at or above its
  share waits like everyone else.

Victims (this module) are chosen on one node, in one pool of an allowed GPU type:

- only allocations that are preemptible, not already stopping, preempted fewer than
  `max_preemptions_per_job` times, and running for at least
  `min_runtime_before_preemption_s` since they started or resumed;
- of a strictly lower tier, or of the job's own tier but from another org holding more
  than `same_tier_preemption_factor` times its weighted share of the tier while the
  job's org holds less than its own (one customer flooding the queue cannot crowd out
  the others of its tier; orgs near their shares never preempt one another), or of any
  tier that holds GPUs beyond its ceiling (borrowed), never taking it below that ceiling;
- never on a node whose GPUs are already being freed by a preemption, nor on one
  draining for another job (a reservation), unless that job is of a lower tier, the
  victims may be of lower tiers, and no other node has victims enough (its drain then
  gives way);
- never taking a victim's tier below its guaranteed floor;
- the best set minimises, in this order: the number of victims, the GPU-seconds of work
  lost since their last checkpoint in whole grace periods (rounded: losses within about
  one grace period count as equal), the highest victim tier, the sum of victim tiers, the
  exact work lost, the GPUs freed beyond what is needed; then the job's type preference
  and node order. Work lost comes before tier: a paid job that has just started, or has
  just checkpointed, loses less than a free one that has run for a minute without a
  checkpoint, and every GPU-second lost is capacity the waiting tiers no longer get
  (bursty, 16 GPUs at 1x, seeds 1-20: work lost 2.27 % of GPU time on average with tier
  first, 1.58 % with this order and enterprise's 3 s threshold; docs/scheduler-experiments.md,
  "Victims by least work lost").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations

from .config import TIER_RANK, PolicyConfig
from .placement import CapacityIndex, Pool, Reservation
from .snapshot import RunningAllocation


@dataclass(frozen=True, slots=True)
class VictimChoice:
    pool: Pool
    victims: tuple[RunningAllocation, ...]
    lost_gpu_seconds: float
    freed_gpus: int
    sort_key: tuple


def overrides_drain(reservation: Reservation, job_rank: int) -> bool:
    """Whether a job of tier rank `job_rank`, preempting lower tiers, may take victims on
    a node draining for another job: only a drain (not GPUs a preemption is freeing) held
    for a job of a strictly lower tier. A paid or free gang job's drain must not keep an
    enterprise job from its prompt start: on the gang-heavy trace at 2x, the enterprise
    jobs startable at once waited 49 s at p95 behind such drains, 13 s once they gave
    way (docs/scheduler-experiments.md, "A lower tier's drain gives way")."""
    return not reservation.claim and reservation.rank < job_rank


def work_lost_gpu_seconds(allocation: RunningAllocation, now: float) -> float:
    """GPU-seconds of progress an allocation loses if stopped now: everything since its
    last checkpoint of this attempt (or since it started, without one)."""
    checkpoint = allocation.last_checkpoint_at
    since = allocation.started_at if checkpoint is None else max(checkpoint, allocation.started_at)
    return max(0.0, now - since) * allocation.gpu_count


def is_victim_candidate(
    allocation: RunningAllocation, job_rank: int, now: float, config: PolicyConfig
) -> bool:
    """Per-allocation eligibility against a job of a higher tier `job_rank` (same-tier
    victims, node-level and floor checks come on top)."""
    return (
        allocation.preemptible
        and not allocation.stopping
        and TIER_RANK.get(allocation.tier, len(TIER_RANK)) < job_rank
        and allocation.preemptions < config.max_preemptions_per_job
        and now - allocation.started_at >= config.min_runtime_before_preemption_s
    )


class VictimFinder:
    """Finds the best victim set for a job. Per-pool candidates are gathered once per
    call, so each search is a cheap pass over the pools of the job's types plus an
    exhaustive choice (at most C(8, 4) = 70 subsets) on the pools that could do."""

    def __init__(self, index: CapacityIndex, now: float, config: PolicyConfig):
        self._index = index
        self._now = now
        self._config = config
        # Losses within one grace period of each other are equal (the stop alone costs that).
        self._loss_step = config.preemption_grace_s or 1.0
        # pool ordinal -> (candidates as (allocation, rank, gpus, lost), GPUs below rank r)
        self._pools: dict[int, tuple[list[tuple], list[int]]] = {}
        self.taken: set = set()  # allocation ids chosen as victims during this call

    def _pool_info(self, pool: Pool) -> tuple[list[tuple], list[int]]:
        info = self._pools.get(pool.ordinal)
        if info is None:
            now, config, ranks = self._now, self._config, TIER_RANK
            protected_since = now - config.min_runtime_before_preemption_s
            cap = config.max_preemptions_per_job
            candidates = []
            below = [0] * (len(ranks) + 1)  # GPUs of candidates of a rank below r
            for allocation in pool.allocations:
                # `is_victim_candidate` without the rank test, which depends on the job.
                rank = ranks.get(allocation.tier)
                if (
                    rank is None
                    or not allocation.preemptible
                    or allocation.stopping
                    or allocation.preemptions >= cap
                    or allocation.started_at > protected_since
                ):
                    continue
                gpus = len(allocation.gpu_ids)
                # `work_lost_gpu_seconds`, inlined
                since = allocation.started_at
                checkpoint = allocation.last_checkpoint_at
                if checkpoint is not None and checkpoint > since:
                    since = checkpoint
                lost = (now - since) * gpus if now > since else 0.0
                candidates.append((allocation, rank, gpus, lost))
                below[rank + 1] += gpus
            if len(candidates) > 1:
                candidates.sort(key=_largest_then_least_lost)
            for above in range(2, len(below)):
                below[above] += below[above - 1]
            info = self._pools[pool.ordinal] = (candidates, below)
        return info

    def _sort_key(self, victims, lost, top_rank, rank_sum, excess, type_rank, pool) -> tuple:
        """The order victim sets are compared in (smallest best; see the module's doc)."""
        step = round(lost / self._loss_step)
        return (victims, step, top_rank, rank_sum, lost, excess, type_rank, pool.ordinal)

    def find(
        self,
        types: Iterable[str],
        count: int,
        job_rank: int,
        may_lose: Callable[[Mapping[str, int]], bool],
        job_id=None,
        same_tier_victim: Callable[[RunningAllocation], bool] | None = None,
        lower_tiers: bool = True,
        borrowed_ranks: frozenset[int] = frozenset(),
    ) -> VictimChoice | None:
        """The best victim set freeing `count` GPUs in one pool of `types`.

        Victims are of a lower tier than `job_rank` (if `lower_tiers`), of the same
        tier where `same_tier_victim(allocation)` allows it, or of a tier in
        `borrowed_ranks` (tiers holding borrowed GPUs, whatever their rank). Pools
        reserved for another job are left alone, except a node draining for a job of a
        lower tier when victims of lower tiers may be taken (`overrides_drain`) and no
        other node has victims enough.
        `may_lose(gpus_by_tier)` says whether the tiers can give up those GPUs."""

        def usable(candidate) -> bool:
            rank = candidate[1]
            return (
                (lower_tiers and rank < job_rank)
                or rank in borrowed_ranks
                or (
                    rank == job_rank
                    and same_tier_victim is not None
                    and same_tier_victim(candidate[0])
                )
            ) and candidate[0].id not in self.taken

        # Pools that could free enough, with how many GPUs each still needs. Those
        # draining for a lower-tier job are a fallback, looked at only if no open pool
        # serves: taking its node sets that job back, and on the bursty runs letting them
        # compete from the start cost work lost for nothing.
        below_rank = job_rank + 1 if same_tier_victim else job_rank
        pools, drained = [], []
        for type_rank, gpu_type in enumerate(types):
            for pool in self._index.pools_by_type.get(gpu_type, ()):
                if pool.size < count or pool.preemption_locked:
                    continue
                reservation = pool.reservation
                if reservation is None or reservation.job_id == job_id:
                    self._add_if_enough(pools, pool, count, type_rank, below_rank, borrowed_ranks)
                elif lower_tiers and overrides_drain(reservation, job_rank):
                    drained.append((pool, type_rank))
        choice = self._choose(pools, job_rank, may_lose, usable, borrowed_ranks)
        if choice is not None or not drained:
            return choice
        pools = []
        for pool, type_rank in drained:
            self._add_if_enough(pools, pool, count, type_rank, below_rank, borrowed_ranks)
        return self._choose(pools, job_rank, may_lose, usable, borrowed_ranks)

    def _add_if_enough(self, pools, pool, count, type_rank, below_rank, borrowed_ranks) -> None:
        """Append (pool, GPUs it still needs, type rank, candidates) to `pools` if its
        candidates of a rank below `below_rank` (or of a borrowing rank) could free them."""
        need = count - len(pool.free_ids)
        if need <= 0:
            return
        candidates, below = self._pools.get(pool.ordinal) or self._pool_info(pool)
        eligible = below[below_rank] + sum(
            below[rank + 1] - below[rank] for rank in borrowed_ranks if rank >= below_rank
        )
        if eligible >= need:
            pools.append((pool, need, type_rank, candidates))

    def _choose(self, pools, job_rank, may_lose, usable, borrowed_ranks) -> VictimChoice | None:
        """The best victim set among `pools` ((pool, GPUs needed, type rank, candidates))."""
        # Fast path: a single victim is always the fewest; take the best single one
        # (least work lost, lowest tier, least excess) without enumerating subsets.
        singles = []
        taken = self.taken
        for pool, need, type_rank, candidates in pools:
            for candidate in candidates:  # largest first: stop at the first too small
                allocation, rank, gpus, lost = candidate
                if gpus < need:
                    break
                if (rank > job_rank and rank not in borrowed_ranks) or allocation.id in taken:
                    continue
                if usable(candidate):
                    key = self._sort_key(1, lost, rank, rank, gpus - need, type_rank, pool)
                    singles.append((key, pool, candidate))
        if singles:
            best = min(singles, key=_first)
            if not may_lose({best[2][0].tier: best[2][2]}):
                singles.sort(key=_first)  # rare: the best would take a tier below its floor
                best = next(
                    (s for s in singles if may_lose({s[2][0].tier: s[2][2]})),
                    None,
                )
            if best is not None:
                key, pool, (allocation, _, gpus, lost) = best
                return VictimChoice(
                    pool=pool,
                    victims=(allocation,),
                    lost_gpu_seconds=lost,
                    freed_gpus=gpus,
                    sort_key=key,
                )

        best: VictimChoice | None = None
        for pool, need, type_rank, candidates in pools:
            choice = self._best_in_pool(
                pool, [c for c in candidates if usable(c)], need, type_rank, may_lose, best
            )
            if choice is not None:
                best = choice
        return best

    def _best_in_pool(
        self, pool, candidates, need, type_rank, may_lose, incumbent
    ) -> VictimChoice | None:
        """The best subset of `candidates` (sorted largest first) freeing `need` GPUs, if
        it beats `incumbent`."""
        total, fewest = 0, 0
        for size in (c[2] for c in candidates):
            total += size
            fewest += 1
            if total >= need:
                break
        if total < need:
            return None
        best = None
        for k in range(fewest, len(candidates) + 1):
            if incumbent is not None and k > incumbent.sort_key[0]:
                return None  # more victims than the best found elsewhere
            for subset in combinations(candidates, k):
                freed = sum(c[2] for c in subset)
                if freed < need:
                    continue
                ranks = [c[1] for c in subset]
                lost = sum(c[3] for c in subset)
                key = self._sort_key(k, lost, max(ranks), sum(ranks), freed - need, type_rank, pool)
                if (best is not None and key >= best.sort_key) or (
                    incumbent is not None and key >= incumbent.sort_key
                ):
                    continue
                by_tier: dict[str, int] = {}
                for allocation, _, gpus, _ in subset:
                    by_tier[allocation.tier] = by_tier.get(allocation.tier, 0) + gpus
                if not may_lose(by_tier):
                    continue
                best = VictimChoice(
                    pool=pool,
                    victims=tuple(c[0] for c in subset),
                    lost_gpu_seconds=lost,
                    freed_gpus=freed,
                    sort_key=key,
                )
            if best is not None:
                return best
        return None


def _first(item: tuple):
    return item[0]


def _largest_then_least_lost(candidate: tuple) -> tuple:
    return (-candidate[2], candidate[3])
