"""Hierarchical weighted fair-share order of the queue: tier → org → user → place in line.

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
- A tier below its guaranteed floor, both in GPUs held now and in its load (the blend
  above), is served before any tier at or above its own floor: a tier that had its
  floor lately yields to a burst of the tiers above it; one kept below it for long
  comes first: its first GPU at once, the rest once its oldest job has waited the
  tier's floor wait (`PolicyConfig.tier_floor_wait_s`: free's half an hour). Beyond
  the whole GPUs preemption leaves it, a floor yields to a higher tier whose oldest job
  has waited past its preemption threshold.
- Within a tier (`PolicyConfig.within_tier_fifo`), orgs whose entitlement
  (`Entitlements`: max-min, by weight, capped by demand; rounded up to whole GPUs, as
  jobs take them) covers all they want and what they used lately go first, oldest job
  first, as strict priority would serve the tier; the keys above order only the orgs
  that want more than their share. Fair share then costs the tier's job waits nothing
  until some org wants more than its share. And while a tier's whole queue would hold
  its entitlement for at most `PolicyConfig.within_tier_fifo_backlog_s` (GPUs x max
  runtime), every org of it is served so: a burst the tier drains in minutes goes in
  submission order, a heavy tenant's jobs included; a flood, or a tier kept short of
  GPUs, keeps fair share.
- Within a user, jobs are offered by their place in the tier's queue, ties in snapshot
  order: their submission time, plus `PolicyConfig.queue_delay_per_runtime_s` seconds
  per second of max runtime (0 by default: submission order; above 0, shorter jobs go
  ahead of a longer one submitted a little earlier). "Oldest" above means the earliest
  place, except where tiers are compared (tier aging, floors) and for a tier's wait
  before it preempts, which count from submission. A job behind may still start while
  the one ahead cannot (backfill, which reservations keep from delaying the one ahead).

Each step (peek, then consume) costs O(log users + log orgs) amortised: keys live in
lazy binary heaps (stale entries are dropped when they surface) and only the path of
the consumed job is re-keyed. Building the queue from a
snapshot is a single pass over the jobs plus a sort per user (linear when the snapshot
lists jobs oldest first, as a database `ORDER BY` would).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from .config import TIER_RANK, TIERS, PolicyConfig
from .snapshot import Id, QueueBacklog, QueuedJob, RunningAllocation, UsageSnapshot
from .usage import equivalent_gpus
from .window import listed_users, window_depth


@dataclass(slots=True)
class RunningGpus:
    """GPUs currently held (not stopping) per tier, org and (org, user)."""

    by_tier: dict[str, int] = field(default_factory=dict)
    by_org: dict[str, int] = field(default_factory=dict)
    by_user: dict[tuple[str, str], int] = field(default_factory=dict)
    by_tier_org: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def of(cls, allocations: Iterable[RunningAllocation]) -> RunningGpus:
        """GPUs held by the allocations that are not stopping."""
        by_tier: dict[str, int] = {}
        by_org: dict[str, int] = {}
        by_user: dict[tuple[str, str], int] = {}
        by_tier_org: dict[tuple[str, str], int] = {}
        for allocation in allocations:
            if allocation.stopping:
                continue
            gpus = len(allocation.gpu_ids)
            tier, org = allocation.tier, allocation.org
            by_tier[tier] = by_tier.get(tier, 0) + gpus
            by_org[org] = by_org.get(org, 0) + gpus
            key = (org, allocation.user)
            by_user[key] = by_user.get(key, 0) + gpus
            key = (tier, org)
            by_tier_org[key] = by_tier_org.get(key, 0) + gpus
        return cls(by_tier=by_tier, by_org=by_org, by_user=by_user, by_tier_org=by_tier_org)

    def add(self, tier: str, org: str, user: str, gpus: int) -> None:
        self.by_tier[tier] = self.by_tier.get(tier, 0) + gpus
        self.by_org[org] = self.by_org.get(org, 0) + gpus
        key = (org, user)
        self.by_user[key] = self.by_user.get(key, 0) + gpus
        key = (tier, org)
        self.by_tier_org[key] = self.by_tier_org.get(key, 0) + gpus


@dataclass(slots=True)
class Entitlements:
    """What each tier and org is entitled to now, in GPUs (max-min fair shares).

    - `tier`: the fleet divided over tiers by tier weight, floors and ceilings, each
      capped by its demand (GPUs held + queued);
    - `org`: each tier's share divided over its orgs by org weight, capped by demand;
    - `weighted`: each org's weight share of its tier's, whatever it wants.

    Orgs are keyed (tier, org): an org has one tier, but a snapshot may say otherwise
    (a tier changed while its jobs ran), and the figures must not depend on order.
    """

    tier: dict[str, float]
    org: dict[tuple[str, str], float]
    weighted: dict[tuple[str, str], float]

    @classmethod
    def of(
        cls,
        *,
        capacity: int,
        config: PolicyConfig,
        org_weights: Mapping[str, float],
        running: RunningGpus,
        queued_gpus_by_org: Mapping[tuple[str, str], int],
    ) -> Entitlements:
        demand: dict[tuple[str, str], float] = dict(running.by_tier_org)
        for key, gpus in queued_gpus_by_org.items():
            demand[key] = demand.get(key, 0) + gpus
        demand_by_tier: dict[str, dict[tuple[str, str], float]] = {}
        for key, gpus in demand.items():
            demand_by_tier.setdefault(key[0], {})[key] = gpus
        tier_share = water_fill(
            capacity,
            {tier: math.fsum(demand_by_tier.get(tier, {}).values()) for tier in TIERS},
            config.tier_weights,
            floors=config.floor_gpus(capacity),
            ceilings={t: config.tier_ceilings[t] * capacity for t in TIERS},
        )
        entitled: dict[tuple[str, str], float] = {}
        weighted: dict[tuple[str, str], float] = {}
        for tier, orgs in demand_by_tier.items():
            weights = {key: org_weights.get(key[1], 1.0) for key in orgs}
            entitled.update(water_fill(tier_share[tier], orgs, weights))
            total_weight = math.fsum(weights.values())
            for key, weight in weights.items():
                weighted[key] = tier_share[tier] * weight / total_weight
        return cls(tier=tier_share, org=entitled, weighted=weighted)


class _User:
    __slots__ = ("fair", "head", "jobs", "load", "name", "version")

    def __init__(self, name: str, jobs: list[QueuedJob]):
        self.name = name
        self.jobs = jobs  # by place in the queue; jobs[head] is the next one
        self.head = 0
        self.load = 0.0
        self.fair = 1.0
        self.version = 0  # bumped on every re-key: older heap entries are stale


class _Org:
    __slots__ = (
        "age_version",
        "fair",
        "fifo",
        "lately",
        "load",
        "name",
        "oldest",
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
        self.lately = 0.0  # its decayed past usage, in GPUs held on average
        self.fifo = False  # served oldest first among such orgs (`within_tier_fifo`)
        self.oldest = math.inf  # the earliest place in the queue of its users' jobs
        self.version = 0  # of its entry in its tier's heap by key
        self.age_version = 0  # of its entry in its tier's heap by age


class _Tier:
    __slots__ = (
        "by_submission",
        "fair",
        "gone",
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
        # Where jobs do not take their place in the queue at submission: a lazy min-heap
        # of its jobs by submission time (submitted_at, n, id), and the ids consumed.
        self.by_submission: list[tuple] | None = None
        self.gone: set = set()


def _live_top(heap: list[tuple], members: dict):
    """The member at the top of a lazy heap, dropping stale entries on the way."""
    while heap:
        entry = heap[0]
        member = members.get(entry[-2])
        if member is not None and member.version == entry[-1]:
            return member
        heapq.heappop(heap)
    return None


def _first_submitted(tier: _Tier) -> float:
    """Submission time of the tier's oldest queued job (the tier must have jobs)."""
    heap = tier.by_submission
    if heap is None:  # jobs take their place at submission: the first org's is the oldest
        return _oldest_org(tier).oldest
    gone = tier.gone
    while heap[0][2] in gone:
        heapq.heappop(heap)
    return heap[0][0]


def _oldest_org(tier: _Tier) -> _Org:
    """The org of the tier with the oldest queued job (the tier must have jobs)."""
    heap, orgs = tier.orgs_by_age, tier.orgs
    while True:
        entry = heap[0]
        org = orgs.get(entry[1])
        if org is not None and org.age_version == entry[2]:
            return org
        heapq.heappop(heap)


@dataclass(slots=True)
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
        backlog: Mapping[tuple[str, str], QueueBacklog] | None = None,
        exclude: Collection[Id] = (),
    ):
        """`jobs`: the snapshot's queued jobs. Of each user only the first
        `window_depth` (FIFO) and those with a claim are offered; the
        deeper ones, like `backlog` (the snapshot's unlisted jobs), only count towards
        their org's demand (`queued_gpus_by_org`). `exclude`: ids of jobs that sit this
        round out (they still take their place in the window, as in the snapshot)."""
        self._config = config
        self._capacity = max(1, capacity_gpus)
        self._now = now
        self._aging = config.aging_shares_per_hour / 3600.0
        self._tier_aging = config.tier_aging_shares_per_hour / 3600.0
        self._blend = config.running_weight
        self._within_tier_fifo = config.within_tier_fifo
        self._fifo_slack = config.within_tier_fifo_slack
        self._fifo_backlog_s = config.within_tier_fifo_backlog_s
        self._half_life = config.usage_half_life_s
        self._running_by_tier = dict(running.by_tier)
        self._floor_gpus = config.floor_gpus(capacity_gpus)
        self._floor_whole_gpus = config.guaranteed_gpus(capacity_gpus)
        self._floor_wait_s = config.tier_floor_wait_s
        self._place = {t: _place_in_queue(config.queue_delay_per_runtime_s[t]) for t in TIERS}
        self._tiers: dict[str, _Tier] = {}
        self._size = 0
        self._pick: Pick | None = None
        self._path: tuple[_Tier, _Org, _User] | None = None

        # One pass: group by user name (one lookup per job; a name shared by users of
        # different orgs or tiers is split below), then nest tier → org → user.
        by_user: dict[str, list[QueuedJob]] = {}
        get_user = by_user.get
        for job in jobs:
            group = get_user(job.user)
            if group is None:
                by_user[job.user] = [job]
            else:
                group.append(job)
        grouped: dict[str, dict[str, dict[str, list[QueuedJob]]]] = {}
        for user_name, group in by_user.items():
            first = group[0]
            if len(group) > 1 and _mixed(group, first.tier, first.org):
                parts: dict[tuple[str, str], list[QueuedJob]] = {}
                for job in group:
                    parts.setdefault((job.tier, job.org), []).append(job)
                for (tier_name, org_name), part in parts.items():
                    grouped.setdefault(tier_name, {}).setdefault(org_name, {})[user_name] = part
                continue
            orgs = grouped.get(first.tier)
            if orgs is None:
                orgs = grouped[first.tier] = {}
            users = orgs.get(first.org)
            if users is None:
                orgs[first.org] = {user_name: group}
            else:
                users[user_name] = group
        depth = window_depth(
            (
                len(group)
                for orgs in grouped.values()
                for users in orgs.values()
                for group in users.values()
            ),
            config,
        )
        # Beyond `queue_window_max_jobs` users, only those `listed_users` picks.
        shown = None
        if sum(len(users) for orgs in grouped.values() for users in orgs.values()) > (
            config.queue_window_max_jobs
        ):
            shown = listed_users(
                (
                    (tier_name, org_name, user_name, min(map(_FIFO_ORDER, group)))
                    for tier_name, orgs in grouped.items()
                    for org_name, users in orgs.items()
                    for user_name, group in users.items()
                ),
                config,
            )
        backlog = backlog or {}
        # GPUs asked for by the queued jobs of each (tier, org), listed or not: demand
        # for entitlements.
        self.queued_gpus_by_org: dict[tuple[str, str], int] = {}
        # GPU-seconds at max runtime of each tier's queued jobs, listed or not: how long
        # its queue would hold its entitlement (`within_tier_fifo_backlog_s`).
        queued_work_by_tier: dict[str, float] = {}
        # Per tier, the oldest offered job without a claim (sitting-out jobs included:
        # they all have one).
        self.oldest_unclaimed: dict[str, float] = {}
        for key, unlisted in backlog.items():
            if unlisted.gpus:
                self.queued_gpus_by_org[key] = unlisted.gpus
            if unlisted.gpu_seconds:
                queued_work_by_tier[key[0]] = (
                    queued_work_by_tier.get(key[0], 0.0) + unlisted.gpu_seconds
                )

        count_work = self._within_tier_fifo and max(self._fifo_backlog_s.values()) > 0
        blend, past_weight = self._blend, 1.0 - self._blend
        ln2, half_life = math.log(2), self._half_life  # `equivalent_gpus`, inlined
        usage_by_user, running_by_user = usage.by_user, running.by_user
        aging, now = self._aging, now
        for tier_name, orgs in grouped.items():
            if tier_name not in TIER_RANK:
                raise ValueError(f"unknown tier {tier_name!r}")
            tier = _Tier(tier_name, config.tier_weights[tier_name])
            place = self._place[tier_name]
            oldest_unclaimed = math.inf
            work = queued_work_by_tier.get(tier_name, 0.0)
            for org_name, users in orgs.items():
                weight = float(org_weights.get(org_name, 1.0))
                if not weight > 0:
                    raise ValueError(f"org {org_name!r}: fair-share weight must be positive")
                org = _Org(org_name, weight)
                gpus = self.queued_gpus_by_org.get((tier_name, org_name), 0)
                for user_name, group in users.items():
                    if count_work:
                        for job in group:  # a plain loop: twice as fast as sum() here
                            work += job.gpu_count * job.max_runtime_s
                    user_depth = depth
                    if shown is not None and (tier_name, org_name, user_name) not in shown:
                        user_depth = 0
                    if len(group) > 1:
                        # By place in the queue (FIFO where it is the submission time);
                        # stable: ties keep snapshot order (linear when listed oldest
                        # first, as the dispatcher and the simulator do).
                        group.sort(key=place)
                    if len(group) > user_depth:
                        deeper = group[user_depth:]
                        del group[user_depth:]
                        for job in deeper:
                            if job.claimed_node is None:
                                gpus += job.gpu_count
                            else:
                                group.append(job)  # younger than the rest: FIFO kept
                        if not group:
                            continue
                    for job in group:
                        if job.claimed_node is None:
                            if job.submitted_at < oldest_unclaimed:
                                oldest_unclaimed = job.submitted_at
                            if place is _FIFO_ORDER:
                                break  # in FIFO order the first unclaimed is the oldest
                    if exclude:
                        group = [job for job in group if job.id not in exclude]
                        if not group:
                            continue
                    gpus += sum(map(_GPU_COUNT, group))
                    org.users[user_name] = _User(user_name, group)
                    tier.queued += len(group)
                self.queued_gpus_by_org[(tier_name, org_name)] = gpus
                if org.users:
                    tier.orgs[org_name] = org
            queued_work_by_tier[tier_name] = work
            if tier.queued:
                self._tiers[tier_name] = tier
                self._size += tier.queued
            if oldest_unclaimed < math.inf:
                self.oldest_unclaimed[tier_name] = oldest_unclaimed
        self._floor_exposed = self._floors_exposed_to_preemption()

        self.entitlements = Entitlements.of(
            capacity=capacity_gpus,
            config=config,
            org_weights=org_weights,
            running=running,
            queued_gpus_by_org=self.queued_gpus_by_org,
        )
        # Tiers whose queue their entitlement drains within `within_tier_fifo_backlog_s`:
        # a burst, served oldest first whatever each org wants.
        self._tiers_in_turn = {
            tier_name
            for tier_name, work in queued_work_by_tier.items()
            if count_work
            and self._fifo_backlog_s[tier_name] > 0
            and work <= self._fifo_backlog_s[tier_name] * self.entitlements.tier.get(tier_name, 0.0)
        }
        tier_weight_total = sum(t.weight for t in self._tiers.values())
        for tier in self._tiers.values():
            tier.fair = self._capacity * tier.weight / tier_weight_total
            tier.load = self._load(running.by_tier.get(tier.name, 0), usage.by_tier, tier.name)
            org_weight_total = sum(o.weight for o in tier.orgs.values())
            orgs_by_key, orgs_by_age = tier.orgs_by_key, tier.orgs_by_age
            for org in tier.orgs.values():
                org_name = org.name
                org.fair = tier.fair * org.weight / org_weight_total
                held = running.by_org.get(org_name, 0)
                org.lately = equivalent_gpus(usage.by_org.get(org_name, 0.0), self._half_life)
                org.load = self._blend * held + (1.0 - self._blend) * org.lately
                if self._within_tier_fifo:
                    org.fifo = self._entitled_to_all(tier.name, org, running)
                user_fair = org.fair / len(org.users)
                users_by_key, users_by_age = org.users_by_key, org.users_by_age
                place = self._place[tier.name]
                oldest = math.inf
                for user_name, user in org.users.items():
                    user.fair = user_fair
                    key = (org_name, user_name)
                    user.load = load = blend * running_by_user.get(key, 0) + past_weight * (
                        usage_by_user.get(key, 0.0) * ln2 / half_life
                    )
                    at = place(user.jobs[0])
                    users_by_key.append((load / user_fair - aging * (now - at), at, user_name, 0))
                    users_by_age.append((at, user_name, 0))
                    if at < oldest:
                        oldest = at
                if len(users_by_key) > 1:
                    heapq.heapify(users_by_key)
                    heapq.heapify(users_by_age)
                org.oldest = oldest
                orgs_by_key.append((*self._org_key(org), org_name, 0))
                orgs_by_age.append((oldest, org_name, 0))
            heapq.heapify(orgs_by_key)
            heapq.heapify(orgs_by_age)
            if self._place[tier.name] is not _FIFO_ORDER:
                tier.by_submission = by_submission = [
                    (job.submitted_at, n, job.id)
                    for n, job in enumerate(
                        job
                        for org in tier.orgs.values()
                        for user in org.users.values()
                        for job in user.jobs
                    )
                ]
                heapq.heapify(by_submission)

    def _entitled_to_all(self, tier: str, org: _Org, running: RunningGpus) -> bool:
        """Whether the org's max-min entitlement covers all it wants (held + queued) and
        what it used lately: then it is served FIFO with the other such orgs. An org
        wanting more than its share (a flood, a heavy tenant's burst) is not, whatever
        it holds now: its old backlog would otherwise always come first."""
        key = (tier, org.name)
        if tier in self._tiers_in_turn:
            return True  # a burst that the tier's share serves in minutes, not a flood
        entitled = self.entitlements.org.get(key, 0.0) * self._fifo_slack
        # Jobs take whole GPUs: a share of 0.9 GPU entitles its org to one. On a pool
        # shared by more orgs than GPUs, no org would otherwise be within its share, and
        # the aging of other orgs' floods would keep a newcomer's one job behind them.
        entitled = math.ceil(entitled - 1e-9)  # float sums: 2.0000000001 is 2
        wanted = running.by_tier_org.get(key, 0) + self.queued_gpus_by_org.get(key, 0)
        return wanted <= entitled and org.lately <= entitled

    def _floors_exposed_to_preemption(self) -> frozenset[str]:
        """Tiers below a tier whose oldest unclaimed job has waited past its preemption
        threshold. Such a tier is served first for its floor only up to the whole GPUs
        preemption leaves it: a GPU given to the fraction beyond (free's 0.8 GPU of 16)
        would be the cheapest victim of the very next round, its work and its grace
        lost, and the waiting job started a grace later than on the GPU itself."""
        preempting = [
            TIER_RANK[tier]
            for tier, oldest in self.oldest_unclaimed.items()
            if self._config.past_preemption_threshold(tier, self._now - oldest)
        ]
        if not preempting:
            return frozenset()
        top = max(preempting)
        return frozenset(tier for tier in TIERS if TIER_RANK[tier] < top)

    # -- keys --------------------------------------------------------------------------

    def _load(self, running_gpus: float, decayed: Mapping, key) -> float:
        past = equivalent_gpus(decayed.get(key, 0.0), self._half_life)
        return self._blend * running_gpus + (1.0 - self._blend) * past

    def _aged(self, share_ratio: float, oldest: float, rate: float) -> float:
        return share_ratio - rate * (self._now - oldest)

    def _org_key(self, org: _Org) -> tuple:
        oldest = org.oldest
        if org.fifo:
            return (0, oldest, oldest)
        return (1, self._aged(org.load / org.fair, oldest, self._aging), oldest)

    def _tier_key(self, tier: _Tier) -> tuple:
        oldest = _first_submitted(tier)
        # Below its floor both now and lately (its load): a tier that had its floor
        # lately does not take every GPU freed in a burst of the tiers above it, and one
        # that holds its floor now is not served first for having had little before.
        floor = self._floor_gpus[tier.name]
        held = self._running_by_tier.get(tier.name, 0)
        below_floor = (
            held < floor
            and tier.load < floor
            # Its first GPU at once, the rest of its floor once it has waited for it.
            and (held < 1 or self._now - oldest >= self._floor_wait_s[tier.name])
            and (held < self._floor_whole_gpus[tier.name] or tier.name not in self._floor_exposed)
        )
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
        return _first_submitted(entry)

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
        # peek() found the user's and the org's live entries at the top of their heaps,
        # so they are replaced there; only what changed is re-keyed.
        tier, org, user = path
        jobs, name = user.jobs, user.name
        place = self._place[tier.name]
        if tier.by_submission is not None:
            tier.gone.add(jobs[user.head].id)
        was_at = place(jobs[user.head])
        user.head += 1
        user.version += 1
        tier.queued -= 1
        self._size -= 1
        if placed_gpus:
            charge = self._blend * placed_gpus
            user.load += charge
            org.load += charge
            tier.load += charge
            running = self._running_by_tier
            running[tier.name] = running.get(tier.name, 0) + placed_gpus
            tier.key = None
        if user.head < len(jobs):
            at = place(jobs[user.head])
            key = user.load / user.fair - self._aging * (self._now - at)
            heapq.heapreplace(org.users_by_key, (key, at, name, user.version))
            heapq.heappush(org.users_by_age, (at, name, user.version))
        else:
            heapq.heappop(org.users_by_key)
            del org.users[name]
            user.jobs = []
            if not org.users:
                heapq.heappop(tier.orgs_by_key)
                del tier.orgs[org.name]
                tier.key = None
                return
        rekey = placed_gpus
        if was_at <= org.oldest:  # it held the org's oldest job: the org may have aged
            oldest_user = _live_top(org.users_by_age, org.users)
            oldest = place(oldest_user.jobs[oldest_user.head])
            if oldest != org.oldest:
                org.oldest = oldest
                org.age_version += 1
                heapq.heappush(tier.orgs_by_age, (oldest, org.name, org.age_version))
                tier.key = None
                rekey = True
        if rekey:
            org.version += 1
            heapq.heapreplace(tier.orgs_by_key, (*self._org_key(org), org.name, org.version))


def oldest_unclaimed_at_most(jobs: Iterable[QueuedJob]) -> dict[str, float]:
    """Per tier, the submission time of its oldest job without a claim among `jobs`: a
    lower bound of what a `FairShareQueue` of them reports as `oldest_unclaimed` (which
    looks only at the window's jobs), read in one pass without building the queue."""
    oldest: dict[str, float] = {}
    get = oldest.get
    for job in jobs:
        if job.claimed_node is None:
            tier = job.tier
            known = get(tier)
            if known is None:
                if tier not in TIER_RANK:
                    raise ValueError(f"unknown tier {tier!r}")
                oldest[tier] = job.submitted_at
            elif job.submitted_at < known:
                oldest[tier] = job.submitted_at
    return oldest


_FIFO_ORDER = attrgetter("submitted_at")  # the sort is stable: ties keep snapshot order


def _place_in_queue(delay_per_runtime_s: float) -> Callable[[QueuedJob], float]:
    """A job's place in its tier's queue (`PolicyConfig.queue_delay_per_runtime_s`): its
    submission time, plus that many seconds per second of its max runtime."""
    if not delay_per_runtime_s:
        return _FIFO_ORDER

    def place(job: QueuedJob) -> float:
        return job.submitted_at + delay_per_runtime_s * job.max_runtime_s

    return place


_GPU_COUNT = attrgetter("gpu_count")


def water_fill(
    capacity: float,
    demands: Mapping[str, float],
    weights: Mapping[str, float],
    floors: Mapping[str, float] | None = None,
    ceilings: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Max-min fair division of `capacity` by `weights`, capped by demand and ceilings.

    Nobody gets more than it asks for; what a satisfied claimant leaves is shared among
    the rest in proportion to their weights. Afterwards each claimant is raised to its
    floor (capped by its demand). The result does not depend on the mappings' order."""
    caps = (
        {key: min(demand, ceilings.get(key, demand)) for key, demand in demands.items()}
        if ceilings
        else demands
    )
    share = dict.fromkeys(demands, 0.0)
    # Claimants in order of how soon they saturate (cap per unit of weight): each one
    # either takes its cap or, with everyone after it, the level left. O(n log n), the
    # sort on floats alone. Claimants that saturate at the same level are taken as one
    # group, their sums exact (fsum): no tie needs an order of its own, so none is
    # broken by comparing keys (20,000 orgs of weight 1: 14-22 -> 7-11 ms a call).
    keys = [key for key, cap in caps.items() if cap > 0]
    claim_weights = [weights.get(key, 1.0) for key in keys]
    per_weight = [caps[key] / weight for key, weight in zip(keys, claim_weights, strict=True)]
    order = sorted(range(len(keys)), key=per_weight.__getitem__)
    remaining = capacity
    weight_left = math.fsum(claim_weights)
    start, count = 0, len(order)
    while start < count and remaining > 1e-9 and weight_left > 0:
        level = remaining / weight_left
        saturates_at = per_weight[order[start]]
        if saturates_at > level + 1e-12:
            for i in order[start:]:
                share[keys[i]] = level * claim_weights[i]
            break
        end = start + 1
        while end < count and per_weight[order[end]] == saturates_at:
            end += 1
        group = order[start:end]
        for i in group:
            share[keys[i]] = caps[keys[i]]
        remaining -= math.fsum(caps[keys[i]] for i in group)
        weight_left -= math.fsum(claim_weights[i] for i in group)
        start = end
    if floors:
        for key in share:
            share[key] = max(share[key], min(caps[key], floors.get(key, 0.0)))
    return share


def _mixed(group: list[QueuedJob], tier: str, org: str) -> bool:
    """Whether the jobs of one user name belong to more than one (tier, org)."""
    for job in group:  # noqa: SIM110 (a plain loop: twice as fast as any() on a generator)
        if job.org != org or job.tier != tier:
            return True
    return False
