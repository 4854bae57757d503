"""The queue window: which queued jobs a dispatch round looks at.

A round considers, of each user, only the first `depth` queued jobs in FIFO order
(oldest `submitted_at` first, ties in snapshot order), plus every job with a
`claimed_node`; the deeper jobs only count, per (tier, org), towards their org's demand
(`QueueBacklog`). `depth` (`window_depth`) shares `PolicyConfig.queue_window_jobs`
(2,048) max-min between users: the largest depth at which the users' first `depth` jobs
number at most that many, but at least `queue_depth_per_user` (4). So a few users with
deep queues see far into them (a lone user, 2,048 jobs deep), and thousands of users see
their first 4 each. Like Slurm's `default_queue_depth` and `bf_max_job_user`, this bounds
what a round reads by max(2,048, users × 4) instead of by the whole queue, and it rarely
costs a decision: the policy serves each user oldest first, so a user's (depth+1)th job
could only be reached within one round after its `depth` older jobs had all started or
been passed over in that same round. Deeper jobs come into view as older ones start.

A hard cap, `PolicyConfig.queue_window_max_jobs` (20,000), bounds the round whatever the
number of users: if users × `depth` jobs would exceed it, `depth` shrinks to the largest
that fits (at least 1), and if the users' oldest jobs alone exceed it (100,000 free-tier
users with one job each), only that many users are listed (`listed_users`): the cap is
shared max-min between the tiers, and within a tier each org's users are taken oldest
head first, every org's first user before any org's second. So a tier with many users
never hides another tier, an org with many users never hides another org, and among
more orgs than the cap the oldest heads are listed: the oldest waiting job of each tier
always is. The others wait as backlog (their org's demand stays exact) and come into
view as the listed ones start.

The dispatcher reads exactly this window from PostgreSQL (a `row_number()` per user and
a `GROUP BY` for the backlog), the simulator and the benchmark build their snapshots with
`queue_window`, and the policy applies the same rule to whatever it is given, so a
snapshot listing the whole queue and one listing the window (with its backlog) lead to
the same decisions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from .config import PolicyConfig
from .snapshot import QueueBacklog, QueuedJob

_SUBMITTED_AT = attrgetter("submitted_at")


@dataclass(slots=True)
class QueueWindow:
    listed: list[QueuedJob]  # in the order they were given
    backlog: dict[tuple[str, str], QueueBacklog] = field(default_factory=dict)


def window_depth(jobs_per_user: Iterable[int], config: PolicyConfig) -> int:
    """How many jobs of each user a round considers, given how many each user has
    queued: the largest `depth` for which sum(min(jobs, depth)) over the users stays
    within `queue_window_jobs`, and at least `queue_depth_per_user`; but if that lists
    more than `queue_window_max_jobs`, the largest depth within that cap, and at least 1
    (then `listed_users` picks the users when even 1 each is too many). (The
    dispatcher's SQL computes the same from the positions of the jobs in their users'
    queues.)"""
    users_with = Counter(jobs_per_user)  # jobs queued -> users with that many
    depth = max(config.queue_depth_per_user, _deepest(users_with, config.queue_window_jobs))
    if _listed_at(users_with, depth) > config.queue_window_max_jobs:
        depth = max(1, _deepest(users_with, config.queue_window_max_jobs))
    return depth


def _deepest(users_with: Counter, budget: int) -> int:
    """The largest depth whose jobs, sum(min(jobs, depth)), number at most `budget`."""
    users_left = sum(users_with.values())  # users with more than `depth` jobs
    listed, depth = 0, 0
    while users_left and listed + users_left <= budget:
        listed += users_left
        depth += 1
        users_left -= users_with.get(depth, 0)
    return depth


def _listed_at(users_with: Counter, depth: int) -> int:
    return sum(min(jobs, depth) * users for jobs, users in users_with.items())


def listed_users(
    heads: Iterable[tuple[str, str, str, float]], config: PolicyConfig
) -> set[tuple[str, str, str]] | None:
    """Which users a round lists when there are more than `queue_window_max_jobs` of
    them, from each user's (tier, org, user, submission time of its oldest job); None
    when every user is listed. The cap is shared max-min between tiers; within a tier,
    users go by their rank within their org (each org's oldest head first), then by
    their oldest job's age, then by name."""
    heads = list(heads)
    cap = config.queue_window_max_jobs
    if len(heads) <= cap:
        return None
    by_tier: dict[str, list[tuple[str, str, str, float]]] = {}
    for head in heads:
        by_tier.setdefault(head[0], []).append(head)
    ranked: dict[str, list[tuple]] = {}
    for tier, tier_heads in by_tier.items():
        tier_heads.sort(key=lambda h: (h[3], h[1], h[2]))
        rank_in_org: dict[str, int] = {}
        keyed = []
        for tier_name, org, user, oldest in tier_heads:
            rank = rank_in_org[org] = rank_in_org.get(org, 0) + 1
            keyed.append((rank, oldest, org, user, (tier_name, org, user)))
        keyed.sort()
        ranked[tier] = [entry[-1] for entry in keyed]
    per_tier = _deepest(Counter(len(users) for users in ranked.values()), cap)
    return {key for users in ranked.values() for key in users[:per_tier]}


def queue_window(jobs: Iterable[QueuedJob], config: PolicyConfig) -> QueueWindow:
    """Each listed user's first `window_depth` jobs in FIFO order, plus any job with a
    claim; the others summed per (tier, org) as backlog. O(jobs) when the jobs come
    oldest first."""
    jobs = list(jobs)
    groups: dict[tuple[str, str, str], list[QueuedJob]] = {}
    for job in jobs:
        key = (job.tier, job.org, job.user)
        group = groups.get(key)
        if group is None:
            groups[key] = [job]
        else:
            group.append(job)
    depth_per_user = window_depth(map(len, groups.values()), config)
    users = None  # every user's first jobs, unless there are too many users
    if len(groups) > config.queue_window_max_jobs:
        users = listed_users(
            ((*key, min(map(_SUBMITTED_AT, group))) for key, group in groups.items()), config
        )
    hidden: list[QueuedJob] = []
    for key, group in groups.items():
        depth = depth_per_user if users is None or key in users else 0
        if len(group) <= depth:
            continue
        group.sort(key=_SUBMITTED_AT)  # stable: ties keep the given order
        hidden.extend(job for job in group[depth:] if job.claimed_node is None)
    if not hidden:
        return QueueWindow(listed=jobs)
    hidden_ids = set(map(id, hidden))
    return QueueWindow(
        listed=[job for job in jobs if id(job) not in hidden_ids], backlog=tally(hidden)
    )


def tally(jobs: Iterable[QueuedJob]) -> dict[tuple[str, str], QueueBacklog]:
    """The jobs' count, GPUs and GPU-seconds (at max runtime) per (tier, org)."""
    return {
        key: QueueBacklog(jobs=n, gpus=gpus, gpu_seconds=work)
        for key, (n, gpus, work) in _counts(jobs).items()
    }


def backlog_beside(
    totals: Mapping[tuple[str, str], Sequence[float]], listed: Iterable[QueuedJob]
) -> dict[tuple[str, str], QueueBacklog]:
    """The backlog of a window read apart from its totals: what `totals` ((tier, org) →
    (jobs, GPUs, GPU-seconds) of every eligible queued job) holds beyond the `listed`
    jobs, for each (tier, org) with jobs left out."""
    shown = _counts(listed)
    none = (0, 0, 0.0)
    backlog = {}
    for key, (jobs, gpus, work) in totals.items():
        seen_jobs, seen_gpus, seen_work = shown.get(key, none)
        if jobs > seen_jobs:
            backlog[key] = QueueBacklog(
                jobs=int(jobs) - seen_jobs,
                gpus=int(gpus) - seen_gpus,
                gpu_seconds=max(0.0, float(work) - seen_work),
            )
    return backlog


def _counts(jobs: Iterable[QueuedJob]) -> dict[tuple[str, str], list]:
    """[jobs, GPUs, GPU-seconds] per (tier, org): `tally`'s figures, unboxed (the
    simulator counts its window on every tick)."""
    counts: dict[tuple[str, str], list] = {}
    for job in jobs:
        count = counts.get((job.tier, job.org))
        if count is None:
            count = counts[(job.tier, job.org)] = [0, 0, 0.0]
        count[0] += 1
        count[1] += job.gpu_count
        count[2] += job.gpu_count * job.max_runtime_s
    return counts
