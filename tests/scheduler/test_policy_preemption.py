"""Preemption: who may preempt, which victims, and what keeps it from thrashing."""

from dataclasses import replace

import pytest

from apps.scheduler.policy import Place, PolicyConfig, Preempt, schedule, schedule_round
from apps.scheduler.policy.builders import allocation, job, node, snapshot

NOW = 1000.0
# The fleets here are tiny: without this, the default floors (a GPU or two) would protect
# every victim tier. Floors have their own test below.
NO_FLOORS = PolicyConfig(tier_floors={"enterprise": 0.0, "paid": 0.0, "free": 0.0})


def preempts(decisions):
    return [d for d in decisions if isinstance(d, Preempt)]


def enterprise_job(job_id="urgent", gpus=8, waited=30.0, **fields):
    return job(job_id, tier="enterprise", org="ent", gpus=gpus, submitted_at=NOW - waited, **fields)


def full_node(name, tier, org=None, started_at=0.0, **fields):
    """A node whose 8 GPUs are held by one allocation named like the node."""
    on = node(name)
    held = allocation(
        f"{name}-alloc",
        on,
        range(8),
        tier=tier,
        org=org or f"{tier}-org",
        started_at=started_at,
        **fields,
    )
    return on, held


def run(nodes_and_allocations, queue, config=None):
    fleet = [n for n, _ in nodes_and_allocations]
    running = [a for _, a in nodes_and_allocations if a is not None]
    return schedule(snapshot(fleet, queue, running=running, now=NOW, config=config or NO_FLOORS))


def test_an_enterprise_job_past_its_threshold_preempts_the_lowest_tier():
    decisions = run(
        [full_node("paid-node", "paid"), full_node("free-node", "free")], [enterprise_job()]
    )
    [preempt] = preempts(decisions)
    assert preempt.node == "free-node"
    assert preempt.allocation_ids == ("free-node-alloc",)
    assert preempt.for_job_id == "urgent"
    # The operator reads the threshold as configured: enterprise's 4.5 s, not "4 s".
    assert "past the enterprise threshold of 4.5 s" in preempt.reason


def test_a_paid_job_that_just_started_is_preempted_before_a_free_job_a_minute_in():
    # Work lost decides before tier: the free job would lose 60 s on 8 GPUs (no
    # checkpoint), the paid one a second's.
    decisions = run(
        [
            full_node("paid-node", "paid", started_at=NOW - 1),
            full_node("free-node", "free", started_at=NOW - 60),
        ],
        [enterprise_job()],
    )
    assert preempts(decisions)[0].allocation_ids == ("paid-node-alloc",)


def test_losses_within_a_grace_period_of_each_other_go_to_the_lower_tier():
    shared = node("shared")
    held = [
        allocation("paid-1", shared, [0], tier="paid", org="p", started_at=NOW - 1),
        allocation("free-2", shared, [1], tier="free", org="f", started_at=NOW - 2),
        *(
            allocation(f"ent-{i}", shared, [i], tier="enterprise", org=f"e{i}", started_at=0)
            for i in range(2, 8)
        ),
    ]
    decisions = schedule(
        snapshot([shared], [enterprise_job(gpus=1)], running=held, now=NOW, config=NO_FLOORS)
    )
    assert preempts(decisions)[0].allocation_ids == ("free-2",)


def test_the_gpus_are_not_handed_over_in_the_same_round():
    decisions = run([full_node("free-node", "free")], [enterprise_job()])
    assert preempts(decisions)
    assert not [d for d in decisions if isinstance(d, Place)]


def test_the_fewest_victims_are_chosen():
    split = node("split")
    held = [
        allocation("s1", split, range(4), tier="free", org="f1"),
        allocation("s2", split, range(4, 8), tier="free", org="f2"),
    ]
    whole, one = full_node("whole", "free")
    decisions = schedule(
        snapshot(
            [split, whole], [enterprise_job()], running=[*held, one], now=NOW, config=NO_FLOORS
        )
    )
    assert preempts(decisions)[0].allocation_ids == ("whole-alloc",)


def test_among_equals_the_victim_losing_least_work_since_its_checkpoint_is_chosen():
    decisions = run(
        [
            full_node("stale", "free", last_checkpoint_at=100.0),
            full_node("fresh", "free", last_checkpoint_at=990.0),
        ],
        [enterprise_job()],
    )
    assert preempts(decisions)[0].node == "fresh"


def test_a_single_gpu_job_frees_one_gpu_by_preempting_one_small_victim():
    busy = node("busy")
    held = [allocation(f"b{i}", busy, [i], tier="free", org=f"f{i}") for i in range(8)]
    held[3].last_checkpoint_at = NOW - 1
    decisions = schedule(snapshot([busy], [enterprise_job(gpus=1)], running=held, now=NOW))
    assert preempts(decisions)[0].allocation_ids == ("b3",)


def test_a_non_preemptible_job_is_never_a_victim():
    decisions = run([full_node("pinned", "free", preemptible=False)], [enterprise_job()])
    assert preempts(decisions) == []


def test_a_job_preempted_too_often_is_no_longer_a_victim():
    capped = PolicyConfig().max_preemptions_per_job
    decisions = run([full_node("again", "free", preemptions=capped)], [enterprise_job()])
    assert preempts(decisions) == []
    decisions = run([full_node("again", "free", preemptions=capped - 1)], [enterprise_job()])
    assert len(preempts(decisions)) == 1


def test_a_minimum_runtime_when_configured_protects_a_just_started_job():
    config = PolicyConfig(tier_floors=NO_FLOORS.tier_floors, min_runtime_before_preemption_s=60)
    decisions = run([full_node("new", "free", started_at=NOW - 59)], [enterprise_job()], config)
    assert preempts(decisions) == []


def test_a_node_already_being_freed_is_not_targeted_again():
    busy = node("busy")
    held = [
        allocation("leaving", busy, range(4), tier="free", org="f1", stopping=True),
        allocation("staying", busy, range(4, 8), tier="free", org="f2"),
    ]
    queue = [enterprise_job("second", gpus=4)]
    decisions = schedule(snapshot([busy], queue, running=held, now=NOW, config=NO_FLOORS))
    assert preempts(decisions) == []


def test_no_preemption_before_the_tier_threshold():
    waited = PolicyConfig().preemption_wait_s["enterprise"] - 1
    decisions = run([full_node("free-node", "free")], [enterprise_job(waited=waited)])
    assert preempts(decisions) == []


def test_a_job_never_preempts_a_higher_tier():
    threshold = PolicyConfig().preemption_wait_s["paid"]
    queue = [job("p", tier="paid", org="p", gpus=8, submitted_at=NOW - threshold - 1)]
    decisions = run([full_node("ent-node", "enterprise", org="other")], queue)
    assert preempts(decisions) == []


def test_a_job_never_preempts_its_own_org():
    decisions = run([full_node("ent-node", "enterprise", org="ent")], [enterprise_job()])
    assert preempts(decisions) == []


def same_tier_preemptions(*, ent_weight: float):
    """ "flood" (weight 1) holds the whole 16-GPU fleet next to "ent", which asks for 8
    and holds nothing: what does ent's job preempt?"""
    fleet = [full_node("f1", "enterprise", org="flood"), full_node("f2", "enterprise", org="flood")]
    decisions = schedule(
        snapshot(
            [n for n, _ in fleet],
            [enterprise_job()],
            running=[a for _, a in fleet],
            now=NOW,
            config=NO_FLOORS,
            org_weights={"flood": 1.0, "ent": ent_weight},
        )
    )
    return preempts(decisions)


def test_a_customer_flooding_its_tier_is_preempted_for_the_others_of_that_tier():
    # Next to "ent" of weight 15, the flood holds sixteen times its weighted share.
    [preempt] = same_tier_preemptions(ent_weight=15.0)
    assert preempt.allocation_ids in {("f1-alloc",), ("f2-alloc",)}


def test_a_customer_four_times_over_its_share_is_not_preempted_by_its_own_tier():
    # Next to "ent" of weight 3, the same fleet is four times flood's share: a burst,
    # which ends by itself, not a flood (same_tier_preemption_factor 8).
    assert same_tier_preemptions(ent_weight=3.0) == []


def test_a_same_tier_org_within_its_entitlement_is_not_preempted():
    # "other" (weight 3) holds 8 GPUs, less than its fair entitlement next to "ent"
    # (weight 1); the rest of the fleet runs a free job that may not be preempted.
    fleet = [
        full_node("o1", "enterprise", org="other"),
        full_node("pinned", "free", preemptible=False),
    ]
    running = [a for _, a in fleet]
    decisions = schedule(
        snapshot(
            [n for n, _ in fleet],
            [enterprise_job()],
            running=running,
            now=NOW,
            config=NO_FLOORS,
            org_weights={"other": 3.0, "ent": 1.0},
        )
    )
    assert preempts(decisions) == []


def test_free_jobs_never_preempt():
    queue = [job("free-job", tier="free", gpus=8, submitted_at=0.0)]
    decisions = run([full_node("n", "free", org="other-free")], queue)
    assert preempts(decisions) == []


def test_paid_preempts_free_after_the_paid_threshold():
    threshold = PolicyConfig().preemption_wait_s["paid"]
    queue = [job("p", tier="paid", org="p", gpus=8, submitted_at=NOW - threshold - 1)]
    decisions = run([full_node("free-node", "free")], queue)
    assert preempts(decisions)[0].node == "free-node"


def test_paid_does_not_preempt_a_free_job_expected_to_end_within_its_hold_back():
    config = PolicyConfig(tier_floors=NO_FLOORS.tier_floors)
    threshold, hold_back = config.preemption_wait_s["paid"], config.preemption_hold_back_s["paid"]
    queue = [job("p", tier="paid", org="p", gpus=8, submitted_at=NOW - threshold - 1)]
    # At the observed runtime ratio (1.0 here) the free job ends halfway through paid's
    # hold-back: stopping it would lose its work for a start that comes anyway.
    ending = full_node("free-node", "free", started_at=NOW - 100, max_runtime_s=100 + hold_back / 2)
    assert preempts(run([ending], queue, config)) == []
    lasting = full_node(
        "free-node", "free", started_at=NOW - 100, max_runtime_s=100 + hold_back * 2
    )
    assert preempts(run([lasting], queue, config))[0].node == "free-node"


def hold_back_snapshot(queue, on, held, *, late_runtime_ratio: float, config=NO_FLOORS):
    shot = snapshot([on], queue, running=[held], now=NOW, config=config)
    return replace(shot, runtime_ratio=0.5, late_runtime_ratio=late_runtime_ratio)


def test_paid_is_not_held_back_by_a_free_job_past_its_typical_end():
    # At the late ratio (half its max runtime) the free job should have ended 100 s
    # ago; what bounds it now is its max runtime, 10 minutes away: paid preempts.
    threshold = NO_FLOORS.preemption_wait_s["paid"]
    queue = [job("p", tier="paid", org="p", gpus=8, submitted_at=NOW - threshold - 1)]
    on, overdue = full_node("free-node", "free", started_at=NOW - 700, max_runtime_s=1300)
    decisions = schedule(hold_back_snapshot(queue, on, overdue, late_runtime_ratio=0.5))
    assert preempts(decisions)[0].node == "free-node"


def test_the_hold_back_expects_jobs_to_end_late_not_typically():
    # The free job, 100 s in with a max runtime of 220 s, ends 10 s from now at the
    # median ratio (0.5), within paid's minute; but one in four recent jobs ran 90 % of
    # theirs, and by that it ends 98 s from now: paid does not wait on it.
    threshold = NO_FLOORS.preemption_wait_s["paid"]
    queue = [job("p", tier="paid", org="p", gpus=8, submitted_at=NOW - threshold - 1)]
    on, held = full_node("free-node", "free", started_at=NOW - 100, max_runtime_s=220)
    at_median = schedule(hold_back_snapshot(queue, on, held, late_runtime_ratio=0.5))
    assert preempts(at_median) == []
    late = schedule(hold_back_snapshot(queue, on, held, late_runtime_ratio=0.9))
    assert preempts(late)[0].node == "free-node"


def test_the_hold_back_expects_a_free_job_to_run_as_free_jobs_ran_not_as_enterprise_ones():
    # Enterprise's own requests ran 1 % of their max runtime, which would put the end of
    # this free job (10 s into 1,200) 2 s from now, within enterprise's hold-back. Free
    # jobs ran half of theirs: it ends in ten minutes, and enterprise preempts it.
    threshold = NO_FLOORS.preemption_wait_s["enterprise"]
    urgent = [job("e", tier="enterprise", org="e", gpus=8, submitted_at=NOW - threshold - 1)]
    on, held = full_node("free-node", "free", started_at=NOW - 10, max_runtime_s=1200)
    shot = snapshot([on], urgent, running=[held], now=NOW, config=NO_FLOORS)
    by_enterprise_alone = replace(shot, runtime_ratio=0.01, late_runtime_ratio=0.01)
    assert preempts(schedule(by_enterprise_alone)) == []
    by_tier = replace(
        by_enterprise_alone, runtime_ratios_by_tier={"enterprise": (0.01, 0.01), "free": (0.5, 0.5)}
    )
    assert preempts(schedule(by_tier))[0].node == "free-node"


def test_enterprise_waits_only_for_gpus_expected_within_seconds_and_only_seconds():
    # The free job, 100 s in, is expected to end 2 s from now at the late ratio (half
    # its max runtime): within enterprise's 3 s hold-back, less than a victim's 5 s
    # grace, though its max runtime runs for 100 s more. Enterprise, 1 s past its
    # threshold, waits for it; a job expected to run 10 s more is preempted; and once
    # enterprise has waited its hold-back limit past its threshold, it waits no more.
    # The victim checkpointed a second ago: it would lose too little to buy patience.
    config = PolicyConfig()
    threshold = config.preemption_wait_s["enterprise"]
    hold_back = config.preemption_hold_back_s["enterprise"]
    limit = config.preemption_hold_back_limit_s["enterprise"]
    assert hold_back is not None and hold_back < config.preemption_grace_s
    assert limit is not None

    def decisions(expected_in_s: float, waited: float):
        on, held = full_node(
            "free-node",
            "free",
            started_at=NOW - 100,
            max_runtime_s=2 * (100 + expected_in_s),
            last_checkpoint_at=NOW - 1,
        )
        urgent = enterprise_job(waited=waited)
        return schedule(hold_back_snapshot([urgent], on, held, late_runtime_ratio=0.5))

    assert preempts(decisions(2.0, waited=threshold + 1)) == []
    assert preempts(decisions(10.0, waited=threshold + 1))[0].node == "free-node"
    assert preempts(decisions(2.0, waited=threshold + limit + 1))[0].node == "free-node"


def test_victims_that_would_lose_minutes_buy_the_enterprise_job_patience():
    # The free job holds 8 GPUs and has run 100 s without a checkpoint: preempting it
    # loses 800 GPU-seconds, which buys enterprise 30 s of patience (0.1 s per
    # GPU-second, at most 30 s past its threshold). Its GPUs are expected free in 10 s,
    # past the 3 s hold-back: enterprise waits for them. Had the victim checkpointed a
    # second ago, or were they expected in a minute, or had enterprise waited out its
    # patience, it would preempt.
    config = PolicyConfig()
    threshold = config.preemption_wait_s["enterprise"]
    patience = config.victim_loss_patience_max_s

    def decisions(*, expected_in_s=10.0, waited=threshold + 1, checkpoint=None):
        on, held = full_node(
            "free-node",
            "free",
            started_at=NOW - 100,
            max_runtime_s=2 * (100 + expected_in_s),
            last_checkpoint_at=checkpoint,
        )
        urgent = enterprise_job(waited=waited)
        return schedule(hold_back_snapshot([urgent], on, held, late_runtime_ratio=0.5))

    assert preempts(decisions()) == []
    assert preempts(decisions(checkpoint=NOW - 1))[0].node == "free-node"
    assert preempts(decisions(expected_in_s=60.0))[0].node == "free-node"
    assert preempts(decisions(waited=threshold + patience + 1))[0].node == "free-node"


def test_a_hold_back_limit_must_not_be_negative():
    limits = {"enterprise": -1.0, "paid": None, "free": None}
    with pytest.raises(ValueError, match=r"preemption_hold_back_limit_s\.enterprise"):
        PolicyConfig(preemption_hold_back_limit_s=limits)


def test_an_org_already_holding_its_fair_share_does_not_preempt():
    # Enterprise org "ent" holds 8 of 16 GPUs and is the only enterprise org with work,
    # but it asks for 8 more while free holds the rest: its water-filled entitlement (all
    # of the fleet by weight, capped by demand = 16) allows it; with a ceiling at half the
    # fleet it does not.
    config = PolicyConfig(
        tier_floors=NO_FLOORS.tier_floors,
        tier_ceilings={"enterprise": 0.5, "paid": 1.0, "free": 1.0},
    )
    ent_node, ent_alloc = full_node("ent-node", "enterprise", org="ent")
    decisions = run(
        [(ent_node, ent_alloc), full_node("free-node", "free")], [enterprise_job()], config
    )
    assert preempts(decisions) == []


def test_preemption_never_pushes_the_victim_tier_below_its_floor():
    config = PolicyConfig(tier_floors={"enterprise": 0.0, "paid": 0.0, "free": 0.5})
    decisions = run(
        [full_node("free-node", "free"), full_node("paid-node", "paid", org="p")],
        [enterprise_job()],
        config,
    )
    [preempt] = preempts(decisions)
    assert preempt.node == "paid-node"  # free holds exactly its floor (8 of 16)


def node_with_free_work(name, gpus_held=6):
    """An 8-GPU node where a preemptible free job holds `gpus_held` GPUs, the rest free."""
    on = node(name)
    held = allocation(f"{name}-alloc", on, range(gpus_held), tier="free", org="free-org")
    return on, held


def test_an_enterprise_job_preempts_on_the_node_draining_for_a_paid_gang_job():
    # The only victims are on the node a paid 8-GPU job has been draining: its drain must
    # not keep the enterprise job from its prompt start.
    draining = node_with_free_work("draining")
    pinned = full_node("pinned", "enterprise", org="other-ent", preemptible=False)
    queue = [
        job(
            "gang",
            tier="paid",
            org="paid-org",
            gpus=8,
            submitted_at=NOW - 30,  # under paid's threshold: it drains, it does not preempt
            claimed_node="draining",
        ),
        enterprise_job(),
    ]
    result = schedule_round(
        snapshot(
            [draining[0], pinned[0]],
            queue,
            running=[draining[1], pinned[1]],
            now=NOW,
            config=NO_FLOORS,
        )
    )
    [preempt] = preempts(result.decisions)
    assert (preempt.node, preempt.for_job_id) == ("draining", "urgent")
    assert preempt.allocation_ids == ("draining-alloc",)
    gang = {w.job_id: w for w in result.waiting}["gang"]
    assert "gave way to job urgent (enterprise)" in gang.reason
    assert gang.public_reason == (
        "waiting for 8 H100 GPUs on one node: the node being freed for it went to "
        "higher-priority work"
    )
    assert "urgent" not in gang.public_reason


@pytest.mark.parametrize(
    ("holder", "claimant", "claimant_waited"),
    [("enterprise", "paid", 3600.0), ("enterprise", "enterprise", 30.0)],
    ids=["paid-behind-enterprise", "enterprise-behind-enterprise"],
)
def test_a_drain_never_gives_way_to_a_job_of_the_same_or_a_lower_tier(
    holder, claimant, claimant_waited
):
    draining = node_with_free_work("draining")
    queue = [
        job(
            "holder",
            tier=holder,
            org="holder-org",
            gpus=8,
            submitted_at=NOW - 2,
            claimed_node="draining",
        ),
        job(
            "claimant",
            tier=claimant,
            org="claimant-org",
            gpus=8,
            submitted_at=NOW - claimant_waited,
        ),
    ]
    decisions = run([draining], queue)
    assert "claimant" not in [p.for_job_id for p in preempts(decisions)]
