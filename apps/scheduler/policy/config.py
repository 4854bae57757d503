"""Tiers and the tunable knobs of the scheduling policy.

Defaults (documented in docs/simulator.md, measured by the simulator):

- tier weights enterprise 100, paid 10, free 0.01: a paying tier that waits is served
  almost as strict priority would serve it (with all three tiers busy, 90.9 / 9.1 /
  0.01 %), while floors keep the lower tiers from starving; unused entitlement flows to
  the others in proportion to their weights (max-min fair share), so what enterprise
  leaves goes to paid, and free keeps its floor;
- guaranteed floors enterprise 20 %, paid 10 %, free 5 % of the fleet: a tier below its
  floor both in GPUs held now and in its load (what it had over the usage half-life, as
  fair share counts it) is served before any tier above its own (free: its first GPU
  at once, the rest once its oldest job has waited half an hour), so a burst of a
  higher tier comes first and a tier kept short for long does not starve; preemption
  never pushes a tier below its floor in GPUs held;
- ceilings enterprise 100 %, paid 100 %, free 80 %: what a tier keeps while others
  wait. Beyond its ceiling a tier only borrows: preemptible jobs may take GPUs that
  would otherwise idle (work conservation: a free job runs alone on a one-GPU pool),
  and any other tier waiting `reclaim_wait_s` takes borrowed GPUs back by preemption;
  a non-preemptible job never borrows;
- within a tier, orgs entitled to all they want go oldest job first, and every org
  does while the tier's queue would hold its entitlement for at most 15 minutes (a
  burst; paid: an hour); beyond that (a flood) orgs over their share come after, in
  fair-share order;
- usage half-life 30 min; aging 2 fair shares per hour of waiting within a tier, 0.25
  between tiers, 12 in the order reservations are granted;
- preemption after enterprise 4.5 s, paid 60 s of waiting; free never preempts (except
  to reclaim borrowed GPUs); a job is preempted at most twice; no flat minimum runtime
  protects a victim (a job that just started has lost the least work, so it is the
  cheapest victim, whatever its tier); thrash is bounded by the per-job cap, by victims
  being of a lower tier (or of an org far over its share), and by not preempting when
  GPUs free up by themselves within the grace period; at most 16 preemptions per round
  and tier;
- at most half of the nodes drain for reservations at once, for a multi-GPU job as soon
  as it fits nowhere (`reservation_wait_s` can make it wait first); while a paying tier
  queues, free keeps firm only its floor's share of them while it holds less than its
  floor, one once it holds its floor (at least one either way), and its other drains
  are open to the paying tiers' jobs;
- a round looks at 2,048 queued jobs shared max-min between users (each user's oldest
  first), and at least each user's first 4; deeper jobs only count as demand.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

FREE, PAID, ENTERPRISE = "free", "paid", "enterprise"
TIERS: tuple[str, ...] = (FREE, PAID, ENTERPRISE)
"""All tiers, lowest first."""
TIER_RANK: Mapping[str, int] = {tier: rank for rank, tier in enumerate(TIERS)}
"""Higher rank = higher tier; a job may only preempt jobs of a strictly lower rank."""


def _tier_map(**values):
    return lambda: dict(values)


# The knobs that map each tier to a value: an override may name only some tiers.
TIER_KNOBS = (
    "tier_weights",
    "tier_floors",
    "tier_floor_wait_s",
    "tier_ceilings",
    "preemption_wait_s",
    "preemption_hold_back_s",
    "preemption_hold_back_limit_s",
    "within_tier_fifo_backlog_s",
    "queue_delay_per_runtime_s",
    "drains_yield_to_higher_tiers",
    "drains_within_floor_while_higher_tiers_wait",
)
# The per-tier knobs that hold true or false.
_TIER_FLAGS = ("drains_yield_to_higher_tiers", "drains_within_floor_while_higher_tiers_wait")
# The per-tier knobs where None means "never" (preempts) or "unbounded".
_NONE_MEANS_NEVER = ("preemption_wait_s", "preemption_hold_back_s", "preemption_hold_back_limit_s")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Every knob of the policy; one frozen value shared by the dispatcher and the simulator."""

    tier_weights: Mapping[str, float] = field(
        default_factory=_tier_map(enterprise=100.0, paid=10.0, free=0.01)
    )
    """Each tier's share of the fleet while the others wait. Steep on purpose: measured
    on the bursty scenario against 6 / 3 / 1, enterprise p95 fell from 85 to 37 s (16
    GPUs, 2x) and 48 to 5 s (128 GPUs, 2x), paid p95 from 515 to 439 s (16 GPUs,
    1x) and 210 to 72 s (128 GPUs, 1x), free unchanged, less work lost everywhere
    (docs/simulator.md). The floors, not the weights, are what the lower tiers keep:
    free's weight is a hundredth of a unit, so while paid waits free holds its floor
    and no more. At 1 it took a tenth of what enterprise left (about 9 % of the fleet in
    a paid burst, nearly twice its floor): bursty, 16 GPUs at 2x, seeds 1-12, paid p95
    lower in all 12 (-1 to -50 %), free's waits at 1x about the same (docs/scheduler-experiments.md,
    "Free keeps its floor, not a tenth of what enterprise leaves")."""
    tier_floors: Mapping[str, float] = field(
        default_factory=_tier_map(enterprise=0.20, paid=0.10, free=0.05)
    )
    """Guaranteed fraction of the fleet's GPUs per tier (when the tier has that much work).

    A tier is served first while it holds less than its floor now AND its load (GPUs
    held blended with its decayed usage, `running_weight`) is below it too: a tier that
    had its floor lately yields to a burst of the tiers above it, as strict priority
    would, one kept below it for long is served first, and one that holds its floor now
    is never served first for having had little before. Judged on GPUs held alone, free
    took the next freed GPU in every paid burst: bursty, 16 GPUs at 1x, seeds 1-20, paid
    p95 median 127 -> 103.5 s (strict priority 89.5 s), lower or equal in all 20,
    enterprise p95 at most 22 -> 11 s (docs/scheduler-experiments.md, "Floors over time").
    Preemption never takes a tier below its floor in whole GPUs held; the fraction
    beyond (free's 0.8 GPU of 16) is not served first while a higher tier's job has
    waited past its preemption threshold, as it would be that job's next victim
    (docs/scheduler-experiments.md, "A floor's fraction yields to a job that would preempt it")."""
    tier_floor_wait_s: Mapping[str, float] = field(
        default_factory=_tier_map(enterprise=0.0, paid=0.0, free=1800.0)
    )
    """Per tier: how long its oldest queued job must have waited before the tier is
    served first for the rest of its floor; its first GPU comes at once, and what
    preemption leaves it does not wait. Free waits half an hour: a burst of the paying
    tiers shorter than that takes all but one GPU, as strict priority would serve it,
    and a free tier kept short for longer gets its whole floor, so free's wait stays
    bounded under any overload. Served at once, free's floor took 5 % of a large fleet
    in every deep paid burst and moved no quantile of free's own waits: bursty, 128
    GPUs, seed 1, paid p95 35 -> 20 s at 1x and 777 -> 722 s at 2x (strict priority 22
    / 703 s), free's p50 / p95 / max within 5 s; on 16 GPUs, where free's floor is less
    than a GPU, and on steady and the flood, the same rows
    (docs/scheduler-experiments.md, "Free's floor waits half an hour")."""
    tier_ceilings: Mapping[str, float] = field(
        default_factory=_tier_map(enterprise=1.0, paid=1.0, free=0.8)
    )
    """Fraction of the fleet's GPUs a tier keeps while other tiers wait. Only
    preemptible jobs go beyond it, on GPUs nobody else wants now (borrowing), and
    borrowed GPUs are reclaimed by preemption once another tier has waited
    `reclaim_wait_s`."""
    usage_half_life_s: float = 1800.0
    """Half-life of the decayed GPU-seconds that fair share compares."""
    running_weight: float = 0.5
    """Blend between GPUs held right now (1.0) and decayed past usage (0.0) in an entity's load.

    The running part reacts within a tick (a placement immediately lowers the placer's
    priority); the decayed part remembers who has had the fleet lately."""
    aging_shares_per_hour: float = 2.0
    """Aging among the orgs and users of a tier: an entity's priority rises by this many
    fair shares per hour its oldest queued job has waited. Kept moderate so that an org
    flooding the queue (whose oldest job is always old) does not overtake the others of
    its tier for hours; an entity that gets nothing sees its decayed usage fall anyway."""
    within_tier_fifo: bool = True
    """Within a tier, orgs whose max-min entitlement (by org weight, of the tier's share)
    covers all they want (GPUs held + queued) and what they used lately are served
    oldest job first, as strict priority serves a tier; orgs wanting more than their
    share (a flood, a heavy tenant's burst) come after them, in fair-share order. So
    fair share costs nothing while everyone fits their share, and a flood's old backlog
    never comes first."""
    within_tier_fifo_slack: float = 1.0
    """How far beyond its entitlement an org may want (held + queued, and lately used)
    and still be served oldest first (`within_tier_fifo`): 1.0 = exactly its share."""
    within_tier_fifo_backlog_s: Mapping[str, float] = field(
        default_factory=_tier_map(enterprise=900.0, paid=3600.0, free=900.0)
    )
    """Per tier: a tier whose whole queue (GPUs x max runtime) would hold its entitled
    GPUs for at most this long is served oldest job first, whatever each org wants: a
    burst the tier drains in minutes, a heavy tenant's included, goes in submission
    order, as strict priority serves it; a flood, or a tier persistently short of GPUs
    (free at 2x), keeps fair share between its orgs. One number sets every tier. 900 s
    against off (0), bursty, 16 GPUs at 1x, seeds 1-20: paid's p95 median 196.5 -> 127 s
    (strict priority 89.5 s), lower in 18 seeds; steady's free orgs keep a Jain index of
    0.91. Paid's hour (2026-12-01): at 2x paid's queue holds its share for about 25
    minutes, so with 900 s its heavy tenants' jobs, most of its jobs, waited behind the
    light ones; bursty, 16 GPUs at 2x, seeds 1-8, paid p95 fell by 23-43 %
    (docs/scheduler-experiments.md, "Paid served in submission order for an hour of
    backlog"). Enterprise and free keep 900 s: the flood is enterprise's, and free's
    orgs keep their Jain."""
    queue_delay_per_runtime_s: Mapping[str, float] = field(
        default_factory=_tier_map(enterprise=0.0, paid=0.0, free=0.0)
    )
    """Per tier: a job takes its place in its tier's queue this many seconds after its
    submission per second of its max runtime, so a shorter job goes ahead of a longer
    one submitted a little earlier; 0 (every tier's default): submission order. Its
    place is what "oldest first" means within the tier (and what its org's aging counts
    from); the tiers' aging, floors and a tier's wait before it preempts still count
    from submission. A job is passed only by jobs whose place comes before its own:
    with 1.0, by jobs submitted less than its max runtime (less theirs) after it.
    Off by default: paid at 0.5 lowered paid's p95 on bursty at 2x (16 GPUs, seeds
    1-12, in all 12, by 0-12 %) and on steady (173 -> 129 s, work lost 3.09 -> 2.83 %),
    but took bursty's work lost over 2 % in seed 12 at 2x (2.60 %), enterprise's p95
    to 13 s in seed 5 at 1x, the flood's work lost from 3.69 to 4.68 % and paid's max
    waits up; at 1.0 utilisation while queued fell under 99 % in seed 8 at 1x
    (docs/scheduler-experiments.md, "Shorter paid jobs first")."""
    reservation_aging_shares_per_hour: float = 12.0
    """Aging in the order reservations are granted within a tier, by each job's own
    wait: a multi-GPU job cannot start without a reservation on a busy fleet, so old
    ones must come first quickly (one fair share per five minutes of waiting)."""
    tier_aging_shares_per_hour: float = 0.25
    """The same between tiers, kept slow: floors and decaying usage already keep a tier
    from starving, and fast aging across tiers would turn tier weights into FIFO."""
    preemption_wait_s: Mapping[str, float | None] = field(
        default_factory=_tier_map(enterprise=4.5, paid=60.0, free=None)
    )
    """How long a job of each tier waits before it may preempt; None = never preempts.
    Enterprise's 4.5 s leaves its 10 s target the victims' 5 s grace and part of a tick,
    and every second of it lets more GPUs free up by themselves before a victim loses
    its work: on bursty, 16 GPUs, against 3 s, work lost fell from 0.58-2.09 % to
    0.35-1.35 % at 1x (seeds 1-20) and from 1.67-3.46 % to 1.59-2.47 % at 2x (seeds
    1-8; under 2 % in 5 of 8, 1 before), the jobs that could start at once by
    preempting still starting within 10 s at p95 in every run; 5 s took them to 11 s
    (docs/scheduler-experiments.md, "Enterprise waits 4.5 s before it preempts"). 2 s -> 3 s
    earlier: 2.3 -> 1.6 % at 1x (means)."""
    preemption_hold_back_s: Mapping[str, float | None] = field(
        default_factory=_tier_map(enterprise=3.0, paid=60.0, free=None)
    )
    """A tier's preemption past its threshold waits while the GPUs it needs are expected to
    free up by themselves within this many seconds (running jobs' ends at the observed
    runtime ratio; a job already past that is bounded only by its max runtime); None =
    never held back. Reclaims (any tier, before its threshold) hold back within
    `preemption_grace_s`. Running jobs count at the late runtime ratio
    (each tier's own, `ClusterSnapshot.late_ratio`, the 75th percentile): at the median, half of
    them ran late, and on a large fleet some node always looked about to free up
    (steady, enterprise holding back 3 s: p95 9 -> 162 s). Enterprise waits within 3 s,
    less than its victims' grace, for at most 3 s (`preemption_hold_back_limit_s`):
    bursty, 16 GPUs at 1x, seeds 1-20, against never, work lost mean 1.13 -> 0.98 %
    (range 0.80-2.16 -> 0.65-1.56 %), enterprise p95 8-11 -> 8-10 s; steady's work lost
    3.22 -> 2.80 % (docs/scheduler-experiments.md, "Floors over time"). Paid, once past its minute,
    takes only GPUs that would stay busy for another minute: a victim about to end loses
    its work for a start that would have come anyway, and on short-job workloads that
    loss is capacity paid itself waits for (bursty, 16 GPUs at 1x, seeds 1-20, against
    5 s: work lost 1.58 -> 1.18 % mean; paid p95 median 232 -> 219 s). On long jobs
    (steady) paid still preempts after its minute: paid p95 268 s against 259 s with 5 s
    (359 s when a job past its typical end counted as ending now). Free never preempts
    past a threshold (it has none)."""
    preemption_hold_back_limit_s: Mapping[str, float | None] = field(
        default_factory=_tier_map(enterprise=3.0, paid=None, free=None)
    )
    """How long past its threshold a tier's preemption may be held back at most; None =
    for as long as GPUs are expected free within its hold-back. Enterprise: 3 s, so its
    worst case stays its threshold, this, the victims' grace and a tick. Unbounded, on
    the v2023 trace the enterprise jobs that could have started at once by preempting
    waited 25 s at p95 (some node of 2,781 GPUs nearly always looked about to free up);
    bounded, 11 s. Paid's is unbounded: bounding it to its minute cost bursty's work lost
    (16 GPUs at 1x, seeds 1-20, mean 0.98 -> 1.63 %)."""
    victim_loss_patience_s_per_gpu_s: float = 0.1
    """Past its threshold and its hold-back, a job still waits for GPUs expected to free up
    by themselves when its cheapest victims would lose much: this many seconds per
    GPU-second they would lose since their last checkpoint, at most
    `victim_loss_patience_max_s` past its threshold. A victim a few seconds in costs
    nothing here; two 2-GPU jobs minutes into runs without checkpoints made most of a
    run's work lost (docs/scheduler-experiments.md, "A victim's loss buys the claimant
    patience")."""
    victim_loss_patience_max_s: float = 30.0
    """The most a victim set's loss makes a job wait past its threshold."""
    runtime_ratio_min_samples: int = 10
    """How many of a tier's recently finished attempts its observed runtime ratios need;
    with fewer, its running jobs are expected to run their whole max runtime (ratio 1).
    On `make up`, ten GPUs held by free jobs, the ratio of one short enterprise job made
    free jobs look about to end, and held the next enterprise jobs back to the limit
    (9.5 and 9.7 s to start; docs/scheduler-experiments.md, "Runtime ratios per tier, from ten
    finishes"). Start estimates, which decide nothing, use the median of as few as three
    (`estimate.ESTIMATE_MIN_SAMPLES`)."""
    max_preemptions_per_job: int = 2
    """A job preempted this many times is no longer a victim."""
    min_runtime_before_preemption_s: float = 0.0
    """A job that started or resumed less than this ago is never a victim. Off by default:
    a flat minimum made an enterprise job wait out a free job that had just started,
    while that job, having run least, is the one that loses least work."""
    reclaim_wait_s: float = 5.0
    """A job of any tier that has waited this long may take back, by preemption, GPUs
    that another tier holds beyond its ceiling (borrowed), down to that ceiling."""
    preemption_grace_s: float = 5.0
    """How long a victim takes to stop; a waiting job that will fit sooner than this by
    itself does not preempt."""
    same_tier_preemption_factor: float = 8.0
    """A job may preempt jobs of its own tier only from an org holding more than this many
    times its weighted share of the tier, and only for an org holding less than its own
    share: a customer flooding the queue cannot crowd out the others of its tier, while
    orgs near their shares never preempt one another. 8 rather than 2: a heavy tenant's
    burst of short jobs ends by itself, and preempting it was most of the work lost on
    small pools (bursty, 16 GPUs, seeds 1-3: 1x 2.84 / 2.64 / 2.53 % -> 2.13 / 2.49 /
    2.53 %, 2x 7.39 / 7.88 / 7.85 % -> 4.59 / 5.42 / 6.26 %); a flood holds far more
    (the flood scenario printed the same row with 8 as with 2)."""
    max_preemptions_per_tick: int = 16
    """Upper bound on Preempt decisions per policy call and tier (limits preemption
    storms; per tier, so that paid preempting free never uses up enterprise's turn)."""
    reserved_node_share: float = 0.5
    """At most this fraction of active nodes drain for blocked multi-GPU jobs at once
    (reservations). Each tier may hold a share of them proportional to its fair
    entitlement; within a tier they go in fair-share order, and are kept until the job
    starts. The rest of the fleet stays open to long jobs that cannot backfill."""
    reservation_wait_s: float = 0.0
    """How long a multi-GPU job that fits nowhere waits before a node is drained for it
    (a reservation); 0 = at once. Where jobs are short, GPUs free up side by side within
    seconds and the job may start without a drain, while one begun at once keeps the
    first GPU it frees idle until the others follow; the job's wait stays bounded (this
    much longer at most). Off by default: measured at 20 s (docs/scheduler-experiments.md, "Drains
    after a short wait"), bursty on 16 GPUs at 1x gains (seeds 1-20: utilisation while
    work is queued at least 98.8 -> 99.1 %, enterprise p95 8-11 -> 8-10 s, work lost
    mean 1.06 -> 1.01 %), but long jobs lose by it (steady: work lost 2.42 -> 3.18 %,
    paid p95 233 -> 301 s; the flood: the other enterprise customers' p95 growth +8.4 ->
    +18.7 %). A fleet of short requests may set it (GANTRY_POLICY)."""
    drains_yield_to_higher_tiers: Mapping[str, bool] = field(
        default_factory=_tier_map(enterprise=False, paid=False, free=False)
    )
    """Per tier: whether a node draining for one of its multi-GPU jobs is open to the
    jobs of higher tiers, whose free GPUs they take as on any other node (the drain goes
    on with what is left). Off for every tier: a drain keeps its node for its job,
    whatever waits (a higher tier's job may still preempt there, `overrides_drain`)."""
    drains_within_floor_while_higher_tiers_wait: Mapping[str, bool] = field(
        default_factory=_tier_map(enterprise=False, paid=False, free=True)
    )
    """Per tier: whether, while a higher tier has jobs queued, the tier keeps firm only
    its floor's share of the drain budget while it holds less than its floor in GPUs,
    and one drain once it holds its floor (at least one either way): it gets no new
    drain beyond that, and its drains beyond it are open to the higher tiers' jobs, as
    with `drains_yield_to_higher_tiers`. Its share by entitlement is what the tiers above
    leave; where they queue single-GPU requests that is most of the fleet, and its drains
    held the GPUs those requests waited for. On for free: on the inference-and-training
    trace at 2x the paying tiers' p95 went from behind strict priority's to ahead of it
    (enterprise 6 -> 3 s, paid 48 -> 7 s; strict 4 / 9 s), free's p95 3,994 -> 2,383 s;
    a pool of one or two nodes keeps its one drain, so bursty on 16 GPUs is unchanged;
    costs: steady paid p95 173 -> 179 s, the flood's growth +2.8 -> +5.3 %, gang-heavy at
    2x paid p95 1,062 -> 1,146 s (strict 2,441 s) (docs/scheduler-experiments.md, "Free
    keeps its floor's share of the drains while the paying tiers wait"). One drain, not
    the floor's share, once free holds its floor: on a large fleet that share was a dozen
    nodes draining for a free tier already far beyond its floor, held from the paying
    tiers' requests (heavy-tenants at 1x, paid p95 47 -> 33 s; steady 179 -> 80 s; the
    flood's growth +5.3 -> +0.1 %; "Free's drains once it holds its floor")."""
    scan_budget: int = 500
    """Jobs examined in a row without a decision before the call stops (bounds the work
    per decision on huge queues where nothing more fits)."""
    queue_window_jobs: int = 2048
    """Queued jobs a round looks at, shared max-min between users: each user's first
    `depth` jobs (FIFO), `depth` as large as keeps the total within this budget, plus any
    job with a claim; the deeper jobs only count towards their org's demand and come into
    view as older ones start (see `window.py`). Bounds what a round reads, whatever the
    size of the queue, while a few users with deep queues still see far into them."""
    queue_depth_per_user: int = 4
    """...but never fewer than this many jobs of each user, while users × this many
    jobs stay within `queue_window_max_jobs`."""
    queue_window_max_jobs: int = 20_000
    """Queued jobs a round looks at, at most, however many users queue (claimed jobs
    besides): fewer jobs of each user, down to one, and beyond that only this many users,
    shared max-min between tiers and, within a tier, each org's oldest user first (see
    `window.py`). Bounds the tick's read and decide at 100,000 queued users."""

    def floor_gpus(self, capacity_gpus: float) -> dict[str, float]:
        """Each tier's floor in GPUs, fractions kept: what it is served first below (the
        fair-share order), what its drains are measured against and what water-filling
        gives it before the weights share the rest."""
        return {t: self.tier_floors[t] * capacity_gpus for t in TIERS}

    def guaranteed_gpus(self, capacity_gpus: int) -> dict[str, int]:
        """Each tier's floor in the whole GPUs preemption never takes from it (5 % of 16
        GPUs guarantees none: a fraction must not shield a job from preemption)."""
        return {t: math.floor(self.tier_floors[t] * capacity_gpus + 1e-9) for t in TIERS}

    def past_preemption_threshold(self, tier: str, waited_s: float) -> bool:
        """Whether a job of `tier` that has waited `waited_s` may preempt lower tiers."""
        threshold = self.preemption_wait_s.get(tier)
        return threshold is not None and waited_s >= threshold

    def __post_init__(self):
        if _is_number(self.within_tier_fifo_backlog_s):
            # One number, as before the knob was per tier: the same for every tier.
            backlog = dict.fromkeys(TIERS, self.within_tier_fifo_backlog_s)
            object.__setattr__(self, "within_tier_fifo_backlog_s", backlog)
        self._check_numbers()
        for name in TIER_KNOBS:
            values = getattr(self, name)
            missing = set(TIERS) - set(values)
            if missing:
                raise ValueError(f"{name}: missing tier(s) {sorted(missing)}")
        for tier in TIERS:
            if self.tier_weights[tier] <= 0:
                raise ValueError(f"tier_weights.{tier}: must be positive")
            if not 0.0 <= self.tier_floors[tier] <= self.tier_ceilings[tier] <= 1.0:
                raise ValueError(f"tier {tier}: need 0 <= floor <= ceiling <= 1")
            for name in _NONE_MEANS_NEVER:
                seconds = getattr(self, name)[tier]
                if seconds is not None and seconds < 0:
                    raise ValueError(f"{name}.{tier}: must be >= 0 or None")
            if self.tier_floor_wait_s[tier] < 0:
                raise ValueError(f"tier_floor_wait_s.{tier}: must be >= 0")
            if self.within_tier_fifo_backlog_s[tier] < 0:
                raise ValueError(f"within_tier_fifo_backlog_s.{tier}: must be >= 0")
            if not self.queue_delay_per_runtime_s[tier] >= 0:
                raise ValueError(f"queue_delay_per_runtime_s.{tier}: must be >= 0")
        if sum(self.tier_floors[tier] for tier in TIERS) > 1.0 + 1e-9:
            raise ValueError("tier_floors: floors add up to more than the whole fleet")
        if self.within_tier_fifo_slack < 1.0:
            raise ValueError("within_tier_fifo_slack: must be >= 1")
        if self.usage_half_life_s <= 0:
            raise ValueError("usage_half_life_s: must be positive")
        if not 0.0 <= self.running_weight <= 1.0:
            raise ValueError("running_weight: must be within [0, 1]")
        if not 0.0 <= self.reserved_node_share <= 1.0:
            raise ValueError("reserved_node_share: must be within [0, 1]")
        agings = (
            self.aging_shares_per_hour,
            self.tier_aging_shares_per_hour,
            self.reservation_aging_shares_per_hour,
        )
        if min(agings) < 0:
            raise ValueError("aging_shares_per_hour: must be >= 0")
        if self.queue_depth_per_user < 1:
            raise ValueError("queue_depth_per_user: must be >= 1")
        if self.queue_window_max_jobs < len(TIERS):
            # Shared max-min between tiers: below one user per tier, a tier would see none.
            raise ValueError(f"queue_window_max_jobs: must be >= {len(TIERS)} (a user per tier)")
        if self.same_tier_preemption_factor < 1.0:
            raise ValueError("same_tier_preemption_factor: must be >= 1")
        for name in (
            "reclaim_wait_s",
            "reservation_wait_s",
            "victim_loss_patience_s_per_gpu_s",
            "victim_loss_patience_max_s",
            "max_preemptions_per_job",
            "max_preemptions_per_tick",
            "runtime_ratio_min_samples",
            "scan_budget",
            "queue_window_jobs",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")

    def _check_numbers(self) -> None:
        """A number knob holds a finite number, not a bool: JSON's NaN and Infinity, which
        Python reads, would turn a comparison off (NaN) or hold a job back for ever."""
        for knob in dataclasses.fields(self):
            value = getattr(self, knob.name)
            if knob.name in _TIER_FLAGS:
                if not all(isinstance(flag, bool) for flag in value.values()):
                    raise ValueError(f"{knob.name}: each tier's value must be true or false")
                continue
            if isinstance(knob.default, bool):
                if not isinstance(value, bool):
                    raise ValueError(f"{knob.name}: must be true or false")
                continue
            values = value.items() if isinstance(value, Mapping) else ((None, value),)
            for tier, number in values:
                name = f"{knob.name}.{tier}" if tier else knob.name
                if number is None and knob.name in _NONE_MEANS_NEVER:
                    continue  # "never" / "unbounded", where the knob allows it
                if isinstance(number, bool) or not isinstance(number, int | float):
                    raise ValueError(f"{name}: must be a number")
                if not math.isfinite(number):
                    raise ValueError(f"{name}: must be a finite number")


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def policy_with(
    overrides: Mapping[str, object], *, base: PolicyConfig | None = None
) -> PolicyConfig:
    """`base` (the defaults) with `overrides` applied, as `GANTRY_POLICY` and the
    simulator's `--policy-option` give them: a per-tier knob may name only the tiers it
    changes, the others keep their values. Raises ValueError naming the knob for an
    unknown knob or tier, a value of the wrong type or one out of its range."""
    base = base or PolicyConfig()
    known = {f.name for f in dataclasses.fields(PolicyConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown policy knob(s) {unknown}; the knobs: {sorted(known)}")
    changes = {}
    for name, value in overrides.items():
        # One number for every tier, which PolicyConfig spreads (`within_tier_fifo_backlog_s`).
        for_every_tier = name == "within_tier_fifo_backlog_s" and _is_number(value)
        if name in TIER_KNOBS and not for_every_tier:
            if not isinstance(value, Mapping):
                raise ValueError(f'{name}: a JSON object of tiers, e.g. {{"free": ...}}')
            strange = sorted(set(value) - set(TIERS))
            if strange:
                raise ValueError(f"{name}: unknown tier(s) {strange}; the tiers: {list(TIERS)}")
            value = {**getattr(base, name), **value}
        changes[name] = value
    try:
        return dataclasses.replace(base, **changes)
    except TypeError as exc:  # a string where a number belongs, and the like
        raise ValueError(f"policy knobs {sorted(changes)}: {exc}") from None
