"""Hierarchical weighted fair-share order of the queue: tier → org → user → FIFO.

At each level the child with the lowest *priority key* goes next:

    key = load / fair_share  −  aging × wait of the child's oldest queued job

- `load` (GPUs) blends GPUs held right now with decayed past usage
  (`PolicyConfig.running_weight`); placing a job raises its user's, org's and tier's load
  at once, so one call interleaves entities instead of serving one to exhaustion.
- `fair_share` (GPUs) is the child's weighted slice of its parent's slice of the fleet
  (tiers by tier weight, orgs by org weight, users equally), over the children that have
  queued work. Dividing by it makes shares follow weights: with equal keys an org of
  weight 2 holds twice the GPUs of an org of weight 1.
- aging (`PolicyConfig.aging_shares_per_hour`, `tier_aging_shares_per_hour`) lowers the
  key of whoever has waited longest. Every key's first term is bounded while every
  wait grows, so a job that keeps waiting eventually outranks every job submitted after
  it: no job, org or tier starves. Meanwhile an entity with nothing running sees its
  decayed usage shrink, which lifts it too.
- A tier holding less than its guaranteed floor is served before any tier at or above
  its own floor.
- Within a user, jobs are offered oldest first (FIFO; ties in snapshot order); a younger job that
  fits may still start while an older one cannot (backfill, which reservations keep
  from delaying the older one).

Each step (peek, then consume) costs O(log users + log orgs) amortised: keys live in
lazy binary heaps (stale entries are dropped when they surface) and only the path of
the consumed job is re-keyed. Building the queue from a
snapshot is a single pass over the jobs plus a sort per user (linear when the snapshot
lists jobs oldest first, as a database `ORDER BY` would).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from .config import TIER_RANK, TIERS, PolicyConfig
from .snapshot import QueuedJob, UsageSnapshot
from .usage import equivalent_gpus


@dataclass(slots=True)
class RunningGpus:
    """GPUs currently held (not stopping) per tier, org and (org, user)."""

    by_tier: dict[str, int] = field(default_factory=dict)
    by_org: dict[str, int] = field(default_factory=dict)
    by_user: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, tier: str, org: str, user: str, gpus: int) -> None:
        self.by_tier[tier] = self.by_tier.get(tier, 0) + gpus
        self.by_org[org] = self.by_org.get(org, 0) + gpus
        key = (org, user)
        self.by_user[key] = self.by_user.get(key, 0) + gpus


class _User:
    __slots__ = ("fair", "head", "jobs", "load", "name", "order_key", "version")

    def __init__(self, name: str):
        self.name = name
        self.jobs: list[QueuedJob] = []
        self.head = 0
        self.load = 0.0
        self.fair = 1.0
        self.order_key: tuple = ()
        self.version = 0  # bumped on every re-key: older heap entries are stale

    def head_submitted_at(self) -> float:
        return self.jobs[self.head].submitted_at


class _Org:
    __slots__ = (
        "age_key",
        "fair",
        "load",
        "name",
        "order_key",
        "users",
        "users_by_age",
        "users_by_key",
        "version",
        "weight",
    )

    def __init__(self, name: str, weight: float):
        self.name = name
        self.weight = weight
        self.users: dict[str, _User] = {}
        # Lazy min-heaps: (key..., name, version); an entry is live while the named
        # child is still queued and its version matches (C heapq beats a sorted list).
        self.users_by_key: list[tuple] = []
        self.users_by_age: list[tuple] = []
        self.load = 0.0
        self.fair = 1.0
        self.order_key: tuple = ()
        self.age_key: tuple = ()
        self.version = 0


class _Tier:
    __slots__ = (
        "fair",
        "key",
        "load",
        "name",
        "orgs",
        "orgs_by_age",
        "orgs_by_key",
        "queued",
        "weight",
    )

    def __init__(self, name: str, weight: float):
        self.name = name
        self.weight = weight
        self.orgs: dict[str, _Org] = {}
        self.orgs_by_key: list[tuple] = []
        self.orgs_by_age: list[tuple] = []
        self.load = 0.0
        self.fair = 1.0
        self.queued = 0
        self.key: tuple | None = None  # cached priority key; None when stale


def _live_top(heap: list[tuple], members: dict):
    """The member at the top of a lazy heap, dropping stale entries on the way."""
    while heap:
        entry = heap[0]
        member = members.get(entry[-2])
        if member is not None and member.version == entry[-1]:
            return member
        heapq.heappop(heap)
    return None


@dataclass(frozen=True, slots=True)
class Pick:
    """The job at the head of the fair-share order and why it is there."""

    job: QueuedJob
    tier_share: float  # load / fair share of its tier, org and user at the time of the pick
    org_share: float
    user_share: float

    def describe(self) -> str:
        job = self.job
        return (
            f"fair share: tier {job.tier} at {self.tier_share:.2f}, "
            f"org {job.org} at {self.org_share:.2f}, user {job.user} at {self.user_share:.2f} "
            f"of their share"
        )


class FairShareQueue:
    """The queued jobs of one snapshot in fair-share order (see the module docstring).

    Usage: `pick = queue.peek(tiers)`, then `queue.consume(placed_gpus)` — with the number
    of GPUs the job was given, or 0 when it is passed over for this call.
    """

    def __init__(
        self,
        jobs: Iterable[QueuedJob],
        *,
        capacity_gpus: int,
        config: PolicyConfig,
        org_weights: Mapping[str, float],
        usage: UsageSnapshot,
        running: RunningGpus,
        now: float,
    ):
        self._config = config
        self._capacity = max(1, capacity_gpus)
        self._now = now
        self._aging = config.aging_shares_per_hour / 3600.0
        self._tier_aging = config.tier_aging_shares_per_hour / 3600.0
        self._blend = config.running_weight
        self._half_life = config.usage_half_life_s
        self._running_by_tier = dict(running.by_tier)
        self._floor_gpus = {t: config.tier_floors[t] * capacity_gpus for t in TIERS}
        self._tiers: dict[str, _Tier] = {}
        self._size = 0
        self._pick: Pick | None = None
        self._path: tuple[_Tier, _Org, _User] | None = None

        # One pass: group by tier → org → user (nested dicts: no key tuple per job); then
        # FIFO-sort each user's jobs (linear when the snapshot lists jobs oldest first).
        grouped: dict[str, dict[str, dict[str, list[QueuedJob]]]] = {}
        for job in jobs:
            try:
                grouped[job.tier][job.org][job.user].append(job)
            except KeyError:
                grouped.setdefault(job.tier, {}).setdefault(job.org, {}).setdefault(
                    job.user, []
                ).append(job)
        # GPUs asked for by the queued jobs of each (tier, org): demand for entitlements.
        self.queued_gpus_by_org: dict[tuple[str, str], int] = {}
        for tier_name, orgs in grouped.items():
            if tier_name not in TIER_RANK:
                raise ValueError(f"unknown tier {tier_name!r}")
            tier = self._tiers[tier_name] = _Tier(tier_name, config.tier_weights[tier_name])
            for org_name, users in orgs.items():
                weight = float(org_weights.get(org_name, 1.0))
                if not weight > 0:
                    raise ValueError(f"org {org_name!r}: fair-share weight must be positive")
                org = tier.orgs[org_name] = _Org(org_name, weight)
                gpus = 0
                for user_name, group in users.items():
                    if len(group) > 1:
                        group.sort(key=_FIFO_ORDER)
                    gpus += sum(map(_GPU_COUNT, group))
                    user = org.users[user_name] = _User(user_name)
                    user.jobs = group
                    tier.queued += len(group)
                self.queued_gpus_by_org[(tier_name, org_name)] = gpus
            self._size += tier.queued

        tier_weight_total = sum(t.weight for t in self._tiers.values())
        for tier in self._tiers.values():
            tier.fair = self._capacity * tier.weight / tier_weight_total
            tier.load = self._load(running.by_tier.get(tier.name, 0), usage.by_tier, tier.name)
            org_weight_total = sum(o.weight for o in tier.orgs.values())
            for org in tier.orgs.values():
                org.fair = tier.fair * org.weight / org_weight_total
                org.load = self._load(running.by_org.get(org.name, 0), usage.by_org, org.name)
                user_fair = org.fair / len(org.users)
                for user in org.users.values():
                    user.fair = user_fair
                    key = (org.name, user.name)
                    user.load = self._load(running.by_user.get(key, 0), usage.by_user, key)
                    user.order_key = self._user_key(user)
                    org.users_by_key.append((*user.order_key, user.name, 0))
                    org.users_by_age.append((user.head_submitted_at(), user.name, 0))
                heapq.heapify(org.users_by_key)
                heapq.heapify(org.users_by_age)
                org.age_key = (org.users_by_age[0][0], org.name)
                org.order_key = self._org_key(org)
                tier.orgs_by_key.append((*org.order_key, org.name, 0))
                tier.orgs_by_age.append((*org.age_key, 0))
            heapq.heapify(tier.orgs_by_key)
            heapq.heapify(tier.orgs_by_age)

    # -- keys --------------------------------------------------------------------------

    def _load(self, running_gpus: float, decayed: Mapping, key) -> float:
        past = equivalent_gpus(decayed.get(key, 0.0), self._half_life)
        return self._blend * running_gpus + (1.0 - self._blend) * past

    def _aged(self, share_ratio: float, oldest: float, rate: float) -> float:
        return share_ratio - rate * (self._now - oldest)

    def _user_key(self, user: _User) -> tuple:
        submitted_at = user.head_submitted_at()
        return (self._aged(user.load / user.fair, submitted_at, self._aging), submitted_at)

    def _org_key(self, org: _Org) -> tuple:
        oldest = org.age_key[0]
        return (self._aged(org.load / org.fair, oldest, self._aging), oldest)

    def _tier_key(self, tier: _Tier) -> tuple:
        oldest = _live_top(tier.orgs_by_age, tier.orgs).age_key[0]
        below_floor = self._running_by_tier.get(tier.name, 0) < self._floor_gpus[tier.name]
        return (
            0 if below_floor else 1,
            self._aged(tier.load / tier.fair, oldest, self._tier_aging),
            oldest,
            -TIER_RANK[tier.name],
        )

    # -- queries -----------------------------------------------------------------------

    def __len__(self) -> int:
        return self._size

    def tiers_with_jobs(self) -> list[str]:
        return [name for name, tier in self._tiers.items() if tier.queued]

    def oldest_submitted(self, tier: str) -> float | None:
        """Submission time of the oldest job still in this call's queue for `tier`."""
        entry = self._tiers.get(tier)
        if entry is None or not entry.queued:
            return None
        return _live_top(entry.orgs_by_age, entry.orgs).age_key[0]

    def heads_by_org_priority(
        self, tier: str, extra_load: Mapping[str, float], aging_shares_per_hour: float
    ) -> Iterator[QueuedJob]:
        """The first queued job of each user of `tier`, lowest aged org key first:

            (org load + extra_load[org]) / org fair share − aging × the job's own wait

        so that what the caller hands out as it goes (it grows `extra_load`) is shared
        by org weight, and a job that has waited long enough comes first. Keys are
        refreshed lazily; O(users of the tier) to start, O(log users) per job."""
        entry = self._tiers.get(tier)
        if entry is None:
            return
        aging = aging_shares_per_hour / 3600.0

        def key(org: _Org, job: QueuedJob) -> float:
            load = org.load + self._blend * extra_load.get(org.name, 0.0)
            return load / org.fair - aging * (self._now - job.submitted_at)

        heads = []
        for org in entry.orgs.values():
            for user in org.users.values():
                job = user.jobs[user.head]
                heads.append((key(org, job), job.submitted_at, len(heads), org, job))
        heapq.heapify(heads)
        while heads:
            recorded, submitted_at, order, org, job = heads[0]
            current = key(org, job)
            if current > recorded + 1e-12:
                heapq.heapreplace(heads, (current, submitted_at, order, org, job))
                continue
            heapq.heappop(heads)
            yield job

    def running_gpus(self, tier: str) -> int:
        """GPUs the tier holds, counting placements made during this call."""
        return self._running_by_tier.get(tier, 0)

    # -- iteration ---------------------------------------------------------------------

    def peek(self, tiers: Collection[str] | None = None) -> Pick | None:
        """The next job in fair-share order among `tiers` (all tiers if None)."""
        best: _Tier | None = None
        best_key = None
        for tier in self._tiers.values():
            if not tier.queued or (tiers is not None and tier.name not in tiers):
                continue
            key = tier.key
            if key is None:
                key = tier.key = self._tier_key(tier)
            if best_key is None or key < best_key:
                best, best_key = tier, key
        if best is None:
            self._pick = self._path = None
            return None
        org = _live_top(best.orgs_by_key, best.orgs)
        user = _live_top(org.users_by_key, org.users)
        job = user.jobs[user.head]
        self._path = (best, org, user)
        self._pick = Pick(
            job=job,
            tier_share=best.load / best.fair,
            org_share=org.load / org.fair,
            user_share=user.load / user.fair,
        )
        return self._pick

    def consume(self, placed_gpus: int = 0) -> None:
        """Remove the peeked job; `placed_gpus` > 0 charges its tier, org and user."""
        if self._path is None:
            raise RuntimeError("consume() without a preceding successful peek()")
        path = self._path
        self._path = self._pick = None
        self._consume(path, placed_gpus)

    def _consume(self, path: tuple[_Tier, _Org, _User], placed_gpus: int) -> None:
        tier, org, user = path
        tier.key = None
        user.head += 1
        user.version += 1
        if placed_gpus:
            charge = self._blend * placed_gpus
            user.load += charge
            org.load += charge
            tier.load += charge
            self._running_by_tier[tier.name] = self._running_by_tier.get(tier.name, 0) + placed_gpus
        if user.head < len(user.jobs):
            user.order_key = self._user_key(user)
            heapq.heappush(org.users_by_key, (*user.order_key, user.name, user.version))
            heapq.heappush(org.users_by_age, (user.head_submitted_at(), user.name, user.version))
        else:
            del org.users[user.name]
            user.jobs = []

        org.version += 1
        if org.users:
            oldest = _live_top(org.users_by_age, org.users)
            org.age_key = (oldest.head_submitted_at(), org.name)
            org.order_key = self._org_key(org)
            heapq.heappush(tier.orgs_by_key, (*org.order_key, org.name, org.version))
            heapq.heappush(tier.orgs_by_age, (*org.age_key, org.version))
        else:
            del tier.orgs[org.name]
        tier.queued -= 1
        self._size -= 1


_FIFO_ORDER = attrgetter("submitted_at")  # the sort is stable: ties keep snapshot order
_GPU_COUNT = attrgetter("gpu_count")
