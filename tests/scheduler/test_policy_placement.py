"""Placement: gang, GPU types and memory, best fit, reservations and backfill, node states."""

from apps.scheduler.policy import NodeState, Place, Reserve, policy_with, schedule
from apps.scheduler.policy.builders import allocation, job, node, snapshot


def places(decisions):
    return {d.job_id: d for d in decisions if isinstance(d, Place)}


def test_gang_placement_never_splits_a_job_across_nodes():
    fleet = [node("n0", gpus=8), node("n1", gpus=8)]
    running = [allocation("a0", fleet[0], range(4)), allocation("a1", fleet[1], range(4))]
    decisions = schedule(snapshot(fleet, [job("big", gpus=8)], running=running, now=10.0))
    assert "big" not in places(decisions)  # 4 + 4 free, but on two nodes


def test_gang_placement_puts_all_gpus_on_one_node_of_one_type():
    fleet = [node("n0", "H100", gpus=4), node("n1", "A100", gpus=4), node("n2", "H100", gpus=8)]
    decisions = schedule(snapshot(fleet, [job("big", gpus=8)]))
    place = places(decisions)["big"]
    assert place.node == "n2" and place.gpu_type == "H100"
    assert {gpu_id.split("/")[0] for gpu_id in place.gpu_ids} == {"n2"}
    assert len(set(place.gpu_ids)) == 8


def test_the_most_preferred_allowed_type_with_room_is_chosen_first():
    fleet = [node("h", "H100"), node("a", "A100")]
    decisions = schedule(snapshot(fleet, [job("j", types=("A100", "H100"))]))
    assert places(decisions)["j"].gpu_type == "A100"


def test_the_next_allowed_type_is_used_when_the_preferred_one_is_full():
    fleet = [node("h", "H100", gpus=2), node("a", "A100", gpus=2)]
    running = [allocation("busy", fleet[1], range(2))]
    queue = [job("j", types=("A100", "H100"))]
    decisions = schedule(snapshot(fleet, queue, running=running, now=5.0))
    assert places(decisions)["j"].gpu_type == "H100"


def test_a_type_outside_the_allowed_list_is_never_used():
    fleet = [node("a", "A100")]
    decisions = schedule(snapshot(fleet, [job("j", types=("H100",))]))
    assert decisions == []


def test_the_memory_floor_is_respected():
    fleet = [node("a", "A100"), node("h", "H100")]  # A100: 40 GB, H100: 80 GB
    decisions = schedule(snapshot(fleet, [job("j", min_memory_gb=80)]))
    assert places(decisions)["j"].gpu_type == "H100"


def test_a_job_that_does_not_care_about_the_type_gets_the_cheapest():
    fleet = [node("h", "H100"), node("a", "A100")]
    decisions = schedule(snapshot(fleet, [job("j")]))
    assert places(decisions)["j"].gpu_type == "A100"


def test_best_fit_takes_the_node_with_the_fewest_free_gpus_that_hold_the_job():
    fleet = [node("roomy", gpus=8), node("snug", gpus=8), node("half", gpus=8)]
    running = [
        allocation("a", fleet[1], range(6)),  # snug: 2 free
        allocation("b", fleet[2], range(4)),  # half: 4 free
    ]
    decisions = schedule(snapshot(fleet, [job("pair", gpus=2)], running=running, now=1.0))
    assert places(decisions)["pair"].node == "snug"


def test_best_fit_keeps_a_whole_node_for_a_later_multi_gpu_job():
    fleet = [node("whole", gpus=8), node("partial", gpus=8)]
    running = [allocation("a", fleet[1], range(7))]
    queue = [job("small", submitted_at=0.0), job("big", gpus=8, submitted_at=1.0)]
    decisions = schedule(snapshot(fleet, queue, running=running, now=2.0))
    assert places(decisions)["small"].node == "partial"
    assert places(decisions)["big"].node == "whole"


def _blocked_big_job_fleet():
    """Two nodes whose GPUs free up at t=100 (n0) and t=1000 (n1), each with one GPU
    free now; an 8-GPU job has been waiting for a long time."""
    fleet = [node("n0", gpus=8), node("n1", gpus=8)]
    running = [
        allocation("r0", fleet[0], range(7), started_at=0.0, max_runtime_s=100.0, org="o0"),
        allocation("r1", fleet[1], range(7), started_at=0.0, max_runtime_s=1000.0, org="o1"),
    ]
    return fleet, running


def test_the_head_of_line_multi_gpu_job_reserves_the_node_that_frees_first():
    fleet, running = _blocked_big_job_fleet()
    queue = [job("big", gpus=8, org="big", submitted_at=0.0)]
    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))
    reserves = [d for d in decisions if isinstance(d, Reserve)]
    assert [(r.job_id, r.node, r.start_at) for r in reserves] == [("big", "n0", 100.0)]


def test_a_small_job_does_not_backfill_if_it_would_end_after_the_reservation():
    fleet, running = _blocked_big_job_fleet()
    queue = [
        job("big", gpus=8, org="big", submitted_at=0.0),
        job("long", org="small", submitted_at=5.0, max_runtime_s=500.0),
    ]
    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))
    assert places(decisions)["long"].node == "n1"  # not on n0, reserved from t=100


def test_a_small_job_backfills_where_it_ends_before_the_reservation():
    fleet, running = _blocked_big_job_fleet()
    queue = [
        job("big", gpus=8, org="big", submitted_at=0.0),
        job("short", org="small", submitted_at=5.0, max_runtime_s=60.0),
        job("long", org="small", submitted_at=6.0, max_runtime_s=500.0),
    ]
    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))
    assert places(decisions)["short"].node == "n0"  # done by t=70 < 100
    assert "backfill" in places(decisions)["short"].reason
    assert places(decisions)["long"].node == "n1"


def test_a_multi_gpu_job_gets_a_drain_only_once_it_has_waited_the_reservation_wait():
    # Where jobs are short, GPUs free up side by side within seconds and the job may
    # start without a drain; one begun at once keeps a freed GPU idle while the others
    # follow. After `reservation_wait_s` of waiting it gets one all the same.
    config = policy_with({"reservation_wait_s": 20})
    fleet, running = _blocked_big_job_fleet()
    queue = [
        job("big", gpus=8, org="big", submitted_at=0.0),
        job("small", org="small", submitted_at=1.0, max_runtime_s=500.0),
    ]

    early = schedule(snapshot(fleet, queue, running=running, now=19.0, config=config))
    assert not [d for d in early if isinstance(d, Reserve)]
    assert "small" in places(early)  # the free GPUs are used meanwhile

    late = schedule(snapshot(fleet, queue, running=running, now=20.0, config=config))
    assert [(d.job_id, d.node) for d in late if isinstance(d, Reserve)] == [("big", "n0")]
    assert places(late)["small"].node == "n1"  # it would end after n0 is due


def test_the_reserved_node_goes_to_its_job_once_drained():
    fleet = [node("n0", gpus=8), node("n1", gpus=8)]
    running = [allocation("r1", fleet[1], range(8), started_at=0.0, max_runtime_s=1000.0)]
    queue = [
        job("small", org="other", submitted_at=0.0),  # older, and its org has used nothing
        job("big", gpus=8, org="big", submitted_at=50.0, claimed_node="n0"),
    ]
    decisions = schedule(snapshot(fleet, queue, running=running, now=100.0))
    assert places(decisions)["big"].node == "n0"
    assert "small" not in places(decisions)  # n1 is full and n0 was kept for "big"


def test_draining_and_down_nodes_receive_no_placements():
    fleet = [
        node("draining", state=NodeState.DRAINING),
        node("down", state=NodeState.DOWN),
        node("up", gpus=1),
    ]
    queue = [job(f"j{i}", submitted_at=i) for i in range(5)]
    decisions = schedule(snapshot(fleet, queue))
    assert [d.node for d in decisions] == ["up"]


def test_a_retry_goes_to_another_node_than_the_one_it_failed_on():
    fleet = [node("failed-here", gpus=2), node("elsewhere", gpus=8)]  # best fit: failed-here
    decisions = schedule(snapshot(fleet, [job("retry", avoid_nodes=["failed-here"])]))
    assert places(decisions)["retry"].node == "elsewhere"


def test_a_retry_runs_on_the_node_it_failed_on_rather_than_not_at_all():
    fleet = [node("failed-here", gpus=2), node("busy", gpus=2)]
    running = [allocation("other", fleet[1], range(2))]
    queue = [job("retry", avoid_nodes=["failed-here"])]
    decisions = schedule(snapshot(fleet, queue, running=running, now=5.0))
    assert places(decisions)["retry"].node == "failed-here"


def _busy_pool(paid_gpus: int):
    """Two 8-GPU nodes with one GPU free on each: paid's jobs on the first `paid_gpus`
    of the other 14, free's on the rest, ending a second apart from t=100."""
    fleet = [node("n0", gpus=8), node("n1", gpus=8)]
    running = [
        allocation(
            f"r{i}",
            fleet[i // 7],
            [i % 7],
            tier="paid" if i < paid_gpus else "free",
            org="p" if i < paid_gpus else "f",
            max_runtime_s=100.0 + i,
        )
        for i in range(14)
    ]
    return fleet, running


def test_a_tier_entitled_to_a_sliver_of_a_small_pool_drains_no_node_while_others_wait():
    # 16 GPUs: one node may drain. Paid holds all but two and queues more; free is
    # entitled to its floor (5 %), paid to the rest, so the one drain is paid's: free's
    # 2-GPU job does not keep GPUs idle for itself while paid's jobs wait for them.
    fleet, running = _busy_pool(paid_gpus=14)
    queue = [job("pair", tier="free", org="f", gpus=2, submitted_at=0.0)]
    queue += [job(f"paid{i}", org="q", submitted_at=5.0 + i) for i in range(4)]

    decisions = schedule(snapshot(fleet, queue, running=running, now=60.0))

    assert not [d for d in decisions if isinstance(d, Reserve)]


def test_a_tier_entitled_to_most_of_the_pool_drains_a_node_for_its_multi_gpu_job():
    # The same pool, free holding 12 GPUs and queueing single-GPU jobs behind its 2-GPU
    # job: free is entitled to most of the pool, so the drain is free's.
    fleet, running = _busy_pool(paid_gpus=2)
    queue = [job("pair", tier="free", org="f", gpus=2, submitted_at=0.0)]
    queue += [job(f"free{i}", tier="free", org="g", submitted_at=5.0 + i) for i in range(4)]

    decisions = schedule(snapshot(fleet, queue, running=running, now=60.0))

    assert [d.job_id for d in decisions if isinstance(d, Reserve)] == ["pair"]


def _a_node_draining_for_a_gang_job(gang_tier: str = "free"):
    """n0 frees up at t=100 and has one GPU free now; n1 is full until t=1000. An 8-GPU
    job of `gang_tier` has waited since t=0 and gets n0 drained for it; a paid job of
    500 s (it would end after the drain is due) arrives at t=5."""
    fleet = [node("n0", gpus=8), node("n1", gpus=8)]
    running = [
        allocation("r0", fleet[0], range(7), tier="free", org="f0", max_runtime_s=100.0),
        allocation("r1", fleet[1], range(8), tier="free", org="f1", max_runtime_s=1000.0),
    ]
    queue = [
        job("gang", tier=gang_tier, gpus=8, org="g", submitted_at=0.0),
        job("paid", tier="paid", org="p", submitted_at=5.0, max_runtime_s=500.0),
    ]
    return fleet, running, queue


def test_a_drain_for_a_lower_tier_keeps_its_free_gpu_from_a_paid_job_by_default():
    fleet, running, queue = _a_node_draining_for_a_gang_job()

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))

    assert [(d.job_id, d.node) for d in decisions if isinstance(d, Reserve)] == [("gang", "n0")]
    assert "paid" not in places(decisions)


def test_with_free_drains_yielding_a_paid_job_takes_the_free_gpu_of_a_node_draining_for_free():
    config = policy_with({"drains_yield_to_higher_tiers": {"free": True}})
    fleet, running, queue = _a_node_draining_for_a_gang_job()

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0, config=config))

    assert places(decisions)["paid"].node == "n0"
    assert [(d.job_id, d.node) for d in decisions if isinstance(d, Reserve)] == [("gang", "n0")]


def test_with_every_drain_yielding_a_drain_of_the_waiting_jobs_own_tier_still_holds():
    every = {"free": True, "paid": True, "enterprise": True}
    config = policy_with({"drains_yield_to_higher_tiers": every})
    fleet, running, queue = _a_node_draining_for_a_gang_job(gang_tier="paid")

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0, config=config))

    assert [(d.job_id, d.node) for d in decisions if isinstance(d, Reserve)] == [("gang", "n0")]
    assert "paid" not in places(decisions)


def _busy_nodes_and_free_training_runs(*, paid_waiting: bool, busy_tier: str = "free"):
    """80 nodes (a drain budget of 40, of which free's floor's share is 2; free's floor
    is 32 GPUs), each running `busy_tier` work until t=100 + its index, node 0 with one
    GPU free; five free 8-GPU training runs have waited since t=0 and, maybe, a paid
    request arrived at t=5. Paid wants one GPU, so free's entitlement (and with it its
    share of the drain budget) is far more than its floor's share."""
    fleet = [node(f"n{i:02d}", gpus=8) for i in range(80)]
    running = [
        allocation(
            f"r{i:02d}",
            fleet[i],
            range(7 if i == 0 else 8),
            tier=busy_tier,
            org=f"f{i}",
            max_runtime_s=100.0 + i,
            preemptible=busy_tier != "enterprise",
        )
        for i in range(80)
    ]
    queue = [job(f"train{i}", tier="free", org=f"t{i}", gpus=8) for i in range(5)]
    if paid_waiting:
        queue.append(job("request", tier="paid", org="p", submitted_at=5.0, max_runtime_s=30.0))
    return fleet, running, queue


def _drained_for(decisions):
    return sorted(d.job_id for d in decisions if isinstance(d, Reserve))


_FREE_DRAINS_BY_ENTITLEMENT = policy_with(
    {"drains_within_floor_while_higher_tiers_wait": {"free": False}}
)


def test_free_below_its_floor_keeps_its_floors_share_of_the_drains_while_paid_waits():
    # Free holds nothing: 5 % of a budget of 40 drains, two nodes, stay free's.
    fleet, running, queue = _busy_nodes_and_free_training_runs(
        paid_waiting=True, busy_tier="enterprise"
    )

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))

    assert _drained_for(decisions) == ["train0", "train1"]


def test_free_holding_beyond_its_floor_keeps_one_drain_while_paid_waits():
    # Free holds 639 GPUs, its floor is 32: more drains would be borrowed from paid.
    fleet, running, queue = _busy_nodes_and_free_training_runs(paid_waiting=True)

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))

    assert _drained_for(decisions) == ["train0"]
    assert places(decisions)["request"].node == "n00"


def test_free_drains_by_its_entitlement_when_no_higher_tier_waits():
    fleet, running, queue = _busy_nodes_and_free_training_runs(paid_waiting=False)

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))

    assert _drained_for(decisions) == [f"train{i}" for i in range(5)]


def test_free_drains_by_its_entitlement_while_paid_waits_with_the_flag_off():
    config = _FREE_DRAINS_BY_ENTITLEMENT
    fleet, running, queue = _busy_nodes_and_free_training_runs(paid_waiting=True)

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0, config=config))

    assert _drained_for(decisions) == [f"train{i}" for i in range(5)]


def _three_nodes_draining_for_free_and_paid_requests(*, free_holds: int):
    """80 busy nodes; n00, n01 and n02 have been draining for three free training runs
    since an earlier round (one GPU free on each, the rest busy with free work until
    t=100-102); free holds `free_holds` GPUs in all (its floor is 32), the rest of the
    fleet runs enterprise work; three paid requests that would run past the drains'
    start arrive."""
    fleet = [node(f"n{i:02d}", gpus=8) for i in range(80)]

    def is_free(i: int) -> bool:
        return i < 3 or 21 + (i - 3) * 8 < free_holds

    running = [
        allocation(
            f"r{i:02d}",
            fleet[i],
            range(7 if i < 3 else 8),
            tier="free" if is_free(i) else "enterprise",
            org=f"f{i}",
            max_runtime_s=100.0 + i,
            preemptible=is_free(i),
        )
        for i in range(80)
    ]
    queue = [
        job(f"train{i}", tier="free", org=f"t{i}", gpus=8, submitted_at=i, claimed_node=f"n0{i}")
        for i in range(3)
    ] + [
        job(f"request{i}", tier="paid", org="p", submitted_at=5.0 + i, max_runtime_s=500.0)
        for i in range(3)
    ]
    return fleet, running, queue


def _placed_on(decisions):
    return sorted(d.node for d in places(decisions).values())


def test_free_below_its_floor_keeps_its_two_older_drains_and_opens_the_youngest_to_paid():
    fleet, running, queue = _three_nodes_draining_for_free_and_paid_requests(free_holds=21)

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))

    assert _placed_on(decisions) == ["n02"]


def test_free_holding_its_floor_keeps_its_oldest_drain_and_opens_the_others_to_paid():
    fleet, running, queue = _three_nodes_draining_for_free_and_paid_requests(free_holds=37)

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0))

    assert _placed_on(decisions) == ["n01", "n02"]


def test_free_drains_all_hold_their_nodes_against_paid_requests_with_the_flag_off():
    config = _FREE_DRAINS_BY_ENTITLEMENT
    fleet, running, queue = _three_nodes_draining_for_free_and_paid_requests(free_holds=37)

    decisions = schedule(snapshot(fleet, queue, running=running, now=10.0, config=config))

    assert _placed_on(decisions) == []
