"""The queue window: a round looks at each user's first jobs only; the rest is demand."""

import pytest

from apps.scheduler.policy import (
    FairShareQueue,
    Place,
    PolicyConfig,
    QueueBacklog,
    RunningGpus,
    UsageSnapshot,
    listed_users,
    queue_window,
    schedule,
    window_depth,
)
from apps.scheduler.policy.builders import allocation, job, node, snapshot

DEPTH_2 = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=0)


def placed(decisions):
    return [d.job_id for d in decisions if isinstance(d, Place)]


def _start(fleet, decisions, queue, running, now):
    """What the dispatcher does between two rounds: the placed jobs leave the queue and
    hold their GPUs."""
    by_id = {d.job_id: d for d in decisions if isinstance(d, Place)}
    for queued in queue:
        if queued.id in by_id:
            place = by_id[queued.id]
            on = next(n for n in fleet if n.name == place.node)
            indexes = [int(gpu_id.rsplit("/", 1)[1]) for gpu_id in place.gpu_ids]
            running.append(allocation(f"a-{queued.id}", on, indexes, started_at=now))
    return [queued for queued in queue if queued.id not in by_id]


def test_a_users_jobs_beyond_the_depth_wait_for_the_next_round():
    fleet = [node("n0", gpus=8)]
    queue = [job(f"j{i}", submitted_at=float(i)) for i in range(5)]
    running = []

    first = schedule(snapshot(fleet, queue, running, now=10.0, config=DEPTH_2))
    assert placed(first) == ["j0", "j1"]  # 8 GPUs free, but only 2 jobs in view

    queue = _start(fleet, first, queue, running, now=10.0)
    second = schedule(snapshot(fleet, queue, running, now=11.0, config=DEPTH_2))
    assert placed(second) == ["j2", "j3"]  # in view once the older ones have started


def test_each_user_has_its_own_depth():
    queue = [job(f"a{i}", user="a", submitted_at=float(i)) for i in range(4)]
    queue += [job(f"b{i}", user="b", submitted_at=float(i)) for i in range(4)]
    decisions = schedule(snapshot([node("n0", gpus=8)], queue, now=10.0, config=DEPTH_2))
    assert sorted(placed(decisions)) == ["a0", "a1", "b0", "b1"]


def test_the_depth_follows_fifo_not_the_order_of_the_snapshot():
    queue = [job("young", submitted_at=30.0), job("old", submitted_at=10.0)]
    queue.append(job("middle", submitted_at=20.0))
    config = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=0)
    decisions = schedule(snapshot([node("n0", gpus=8)], queue, now=40.0, config=config))
    assert sorted(placed(decisions)) == ["middle", "old"]


def test_a_job_with_a_claim_is_offered_however_deep_in_its_users_queue():
    fleet = [node("n0", gpus=4), node("n1", gpus=4)]
    running = [allocation("busy", fleet[0], range(4), org="other", user="x")]
    queue = [job(f"j{i}", gpus=4, submitted_at=float(i)) for i in range(3)]
    queue.append(job("claimed", gpus=4, submitted_at=5.0, claimed_node="n1"))
    decisions = schedule(snapshot(fleet, queue, running, now=10.0, config=DEPTH_2))
    assert placed(decisions) == ["claimed"]  # its node, drained for it, is free


def test_few_users_widen_the_window():
    # One user alone: the window of 6 jobs is all hers, although the depth is 2.
    config = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=6)
    queue = [job(f"j{i}", submitted_at=float(i)) for i in range(10)]
    decisions = schedule(snapshot([node("n0", gpus=8)], queue, now=20.0, config=config))
    assert placed(decisions) == [f"j{i}" for i in range(6)]


def test_the_window_is_shared_max_min_between_users():
    config = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=6)
    assert window_depth([10], config) == 6
    assert window_depth([10, 10], config) == 3
    assert window_depth([1, 1, 10], config) == 4  # what the small queues leave is shared
    assert window_depth([3, 3], config) == 3  # everything fits
    assert window_depth([10] * 4, config) == 2  # never below queue_depth_per_user
    assert window_depth([], config) == 2


def test_the_window_lists_each_users_first_jobs_and_sums_the_rest_per_org():
    queue = [job(f"a{i}", org="o1", user="a", gpus=2, submitted_at=float(i)) for i in range(5)]
    queue += [job("b0", org="o1", user="b", gpus=8)]
    queue += [
        job(f"c{i}", tier="free", org="o2", user="c", submitted_at=float(i)) for i in range(3)
    ]
    queue.append(job("a-claimed", org="o1", user="a", gpus=4, submitted_at=9.0, claimed_node="n"))

    window = queue_window(queue, DEPTH_2)

    assert [j.id for j in window.listed] == ["a0", "a1", "b0", "c0", "c1", "a-claimed"]
    assert window.backlog == {
        ("paid", "o1"): QueueBacklog(jobs=3, gpus=6, gpu_seconds=3 * 2 * 3600.0),
        ("free", "o2"): QueueBacklog(jobs=1, gpus=1, gpu_seconds=3600.0),
    }


def test_unlisted_jobs_count_towards_their_orgs_demand():
    listed = [job("a0", org="o1", gpus=2), job("b0", org="o2", gpus=1)]
    fair_share = FairShareQueue(
        listed,
        capacity_gpus=16,
        config=PolicyConfig(),
        org_weights={},
        usage=UsageSnapshot(),
        running=RunningGpus(),
        now=0.0,
        backlog={("paid", "o1"): QueueBacklog(jobs=7, gpus=12), ("free", "o3"): QueueBacklog(1, 8)},
    )
    assert fair_share.queued_gpus_by_org == {
        ("paid", "o1"): 14,
        ("paid", "o2"): 1,
        ("free", "o3"): 8,  # nothing listed, still demand
    }
    assert len(fair_share) == 2


def test_a_windowed_snapshot_and_the_whole_queue_give_the_same_decisions():
    # A busy fleet with an enterprise flood: preemption and reservations depend on the
    # orgs' demand, which the backlog carries for the jobs the window leaves out.
    fleet = [node(f"n{i}", gpus=8) for i in range(4)]
    running = [
        allocation(f"f{i}", fleet[i], range(6), tier="free", org=f"free{i}", user="u")
        for i in range(4)
    ]
    queue = [
        job(f"e{i}", tier="enterprise", org="flood", gpus=(1, 2, 4)[i % 3], submitted_at=i)
        for i in range(30)
    ]
    queue += [job(f"p{i}", org="paid", user=f"u{i % 3}", gpus=2, submitted_at=i) for i in range(9)]
    config = PolicyConfig(queue_depth_per_user=3, queue_window_jobs=0)
    whole = snapshot(fleet, queue, running, now=600.0, config=config)
    window = queue_window(queue, config)
    windowed = snapshot(
        fleet, window.listed, running, now=600.0, config=config, backlog=window.backlog
    )

    assert len(windowed.queued) == 3 + 9 and windowed.backlog
    assert schedule(windowed) == schedule(whole)


def test_an_org_over_its_share_does_not_preempt_although_its_rivals_jobs_are_unlisted():
    # Enterprise org A holds 8 of 16 GPUs and waits with one more job; org B has just
    # queued 11 jobs, of which the window lists one. With B's backlog counted, the tier's
    # share (6/7 of the fleet) splits evenly and A already holds more than its half;
    # counting only B's listed job, A would wrongly think itself entitled to preempt.
    config = PolicyConfig(queue_depth_per_user=1, queue_window_jobs=0)

    def decide(queued, backlog):
        fleet = [node("n0", gpus=8), node("n1", gpus=8)]
        running = [
            allocation(f"a{i}", fleet[0], [i], tier="enterprise", org="A", preemptible=False)
            for i in range(8)
        ]
        running += [allocation(f"f{i}", fleet[1], [i], tier="free", org="F") for i in range(8)]
        return schedule(snapshot(fleet, queued, running, now=600.0, config=config, backlog=backlog))

    queue = [job("a-next", tier="enterprise", org="A", submitted_at=0.0)]
    queue += [job(f"b{i}", tier="enterprise", org="B", submitted_at=599.0) for i in range(11)]
    window = queue_window(queue, config)

    assert [j.id for j in window.listed] == ["a-next", "b0"]
    assert decide(window.listed, window.backlog) == decide(queue, None) == []
    assert [d.for_job_id for d in decide(window.listed, None)] == ["a-next"]  # the bug


def test_many_users_see_fewer_jobs_each_down_to_one_within_the_hard_cap():
    config = PolicyConfig(queue_depth_per_user=4, queue_window_jobs=0, queue_window_max_jobs=6)
    assert window_depth([10], config) == 4  # within the cap: the per-user floor holds
    assert window_depth([10] * 3, config) == 2  # 3 users x 4 would be 12
    assert window_depth([10] * 6, config) == 1
    assert window_depth([10] * 9, config) == 1  # and `listed_users` picks 6 of them


def _heads_queue():
    """Seven users, each with two jobs: org A's three users queued first, then the rest."""
    heads = [("paid", "A", "a1", 1.0), ("paid", "A", "a2", 2.0), ("paid", "A", "a3", 3.0)]
    heads += [("free", "C", "c1", 5.0), ("free", "C", "c2", 6.0), ("paid", "B", "b1", 10.0)]
    heads += [("enterprise", "D", "d1", 20.0)]
    return [
        job(f"{user}-{i}", tier=tier, org=org, user=user, submitted_at=at + i / 10)
        for tier, org, user, at in heads
        for i in range(2)
    ]


def test_more_users_than_the_cap_list_every_tier_and_every_orgs_oldest_user_first():
    config = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=0, queue_window_max_jobs=5)

    window = queue_window(_heads_queue(), config)

    # Two users per tier at most (1 + 2 + 2 = 5): enterprise's only user; of paid, org B's
    # only user before org A's second, though A's users queued long before; free's two.
    assert [j.id for j in window.listed] == ["a1-0", "c1-0", "c2-0", "b1-0", "d1-0"]
    assert window.backlog == {
        ("paid", "A"): QueueBacklog(jobs=5, gpus=5, gpu_seconds=5 * 3600.0),
        ("paid", "B"): QueueBacklog(jobs=1, gpus=1, gpu_seconds=3600.0),
        ("free", "C"): QueueBacklog(jobs=2, gpus=2, gpu_seconds=2 * 3600.0),
        ("enterprise", "D"): QueueBacklog(jobs=1, gpus=1, gpu_seconds=3600.0),
    }


def test_a_claimed_job_is_listed_although_its_user_is_not():
    config = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=0, queue_window_max_jobs=5)
    queue = _heads_queue()
    queue.append(job("a3-claimed", org="A", user="a3", submitted_at=30.0, claimed_node="n0"))

    assert "a3-claimed" in [j.id for j in queue_window(queue, config).listed]


def test_with_more_users_than_the_cap_the_policy_cuts_the_whole_queue_as_the_window_does():
    fleet = [node("n0", gpus=8)]
    config = PolicyConfig(queue_depth_per_user=2, queue_window_jobs=0, queue_window_max_jobs=5)
    queue = _heads_queue()
    window = queue_window(queue, config)
    windowed = snapshot(fleet, window.listed, now=60.0, config=config, backlog=window.backlog)

    decisions = schedule(snapshot(fleet, queue, now=60.0, config=config))

    assert decisions == schedule(windowed)
    assert sorted(placed(decisions)) == ["a1-0", "b1-0", "c1-0", "c2-0", "d1-0"]


def test_listed_users_is_none_while_every_user_fits():
    config = PolicyConfig(queue_window_max_jobs=3)
    heads = [("paid", "A", f"u{i}", float(i)) for i in range(3)]
    assert listed_users(heads, config) is None
    assert listed_users([*heads, ("paid", "B", "v", 9.0)], config) == {
        ("paid", "A", "u0"),
        ("paid", "B", "v"),
        ("paid", "A", "u1"),
    }


@pytest.mark.parametrize(
    "options",
    [{"queue_depth_per_user": 0}, {"queue_window_jobs": -1}, {"queue_window_max_jobs": 2}],
)
def test_the_window_must_be_positive(options):
    with pytest.raises(ValueError):
        PolicyConfig(**options)
