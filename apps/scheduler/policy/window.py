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

The dispatcher reads exactly this window from PostgreSQL (a `row_number()` per user and
a `GROUP BY` for the backlog), the simulator and the benchmark build their snapshots with
`queue_window`, and the policy applies the same rule to whatever it is given, so a
snapshot listing the whole queue and one listing the window (with its backlog) lead to
the same decisions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
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
    within `queue_window_jobs`, and at least `queue_depth_per_user`. (The dispatcher's
    SQL computes the same from the positions of the jobs in their users' queues.)"""
    users_with = Counter(jobs_per_user)  # jobs queued -> users with that many
    users_left = sum(users_with.values())  # users with more than `depth` jobs
    budget, listed, depth = config.queue_window_jobs, 0, 0
    while users_left and listed + users_left <= budget:
        listed += users_left
        depth += 1
        users_left -= users_with.get(depth, 0)
    return max(config.queue_depth_per_user, depth)


def queue_window(jobs: Iterable[QueuedJob], config: PolicyConfig) -> QueueWindow:
    """Each user's first `window_depth` jobs in FIFO order, plus any job with a claim; the
    others summed per (tier, org) as backlog. O(jobs) when the jobs come oldest first."""
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
    hidden: set[int] = set()
    counts: dict[tuple[str, str], list[int]] = {}
    for (tier, org, _), group in groups.items():
        if len(group) <= depth_per_user:
            continue
        group.sort(key=_SUBMITTED_AT)  # stable: ties keep the given order
        for job in group[depth_per_user:]:
            if job.claimed_node is not None:
                continue
            hidden.add(id(job))
            count = counts.setdefault((tier, org), [0, 0])
            count[0] += 1
            count[1] += job.gpu_count
    if not hidden:
        return QueueWindow(listed=jobs)
    return QueueWindow(
        listed=[job for job in jobs if id(job) not in hidden],
        backlog={key: QueueBacklog(jobs=n, gpus=gpus) for key, (n, gpus) in counts.items()},
    )
