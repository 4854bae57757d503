"""Why a job waits, where it stands and when it should start: what the round explains."""

import math

import pytest

from apps.scheduler.policy import (
    Place,
    PolicyConfig,
    UsageSnapshot,
    observed_runtime_ratios,
    observed_runtime_ratios_by_tier,
    schedule,
    schedule_round,
)
from apps.scheduler.policy.builders import allocation, job, node, snapshot

NOW = 1000.0


def waiting_of(result):
    return {w.job_id: w for w in result.waiting}


def test_a_job_behind_a_busy_gpu_says_so_and_expects_its_end():
    pool = node("solo", gpus=1)
    busy = allocation(
        "r", pool, [0], tier="paid", org="secret-org", started_at=NOW - 30, max_runtime_s=100
    )
    queue = [job("mine", tier="paid", org="me", submitted_at=NOW - 5, max_runtime_s=60)]
    result = schedule_round(snapshot([pool], queue, running=[busy], now=NOW))
    mine = waiting_of(result)["mine"]
    assert mine.public_reason == "waiting for an H100: 1 of 1 busy"
    assert (mine.position, mine.estimated_start) == (1, NOW + 70)


def test_a_paid_job_held_back_from_preempting_says_when_it_expects_the_gpu():
    pool = node("solo", gpus=1)
    ending = allocation("r", pool, [0], tier="free", org="f", started_at=NOW - 30, max_runtime_s=60)
    queue = [job("mine", tier="paid", org="me", submitted_at=NOW - 61, max_runtime_s=60)]
    result = schedule_round(snapshot([pool], queue, running=[ending], now=NOW))
    assert result.decisions == []
    mine = waiting_of(result)["mine"]
    assert "not preempting: GPUs are expected to free up by themselves by t=1030" in mine.reason
    assert mine.public_reason == "waiting for an H100: 1 of 1 busy"


def pair_held(tier, orgs):
    """A two-GPU pool whose GPUs free up at NOW + 100 and NOW + 200, held by `orgs`."""
    pool = node("pair", gpus=2)
    held = [
        allocation(f"r{i}", pool, [i], tier=tier, org=org, started_at=NOW, max_runtime_s=end)
        for i, (org, end) in enumerate(zip(orgs, (100, 200), strict=True))
    ]
    return pool, held


def test_positions_and_estimates_follow_the_order_of_service():
    pool, held = pair_held("paid", ("x", "x"))
    queue = [
        job("first", tier="paid", org="a", submitted_at=1.0, max_runtime_s=50),
        job("second", tier="paid", org="a", submitted_at=2.0, max_runtime_s=50),
        job("third", tier="paid", org="a", submitted_at=3.0, max_runtime_s=50),
    ]
    waiting = waiting_of(schedule_round(snapshot([pool], queue, running=held, now=NOW)))
    assert [waiting[j].position for j in ("first", "second", "third")] == [1, 2, 3]
    assert [waiting[j].estimated_start for j in ("first", "second", "third")] == [
        NOW + 100,
        NOW + 150,
        NOW + 200,
    ]


def test_with_every_gpu_busy_a_newcomer_stands_where_fair_share_will_serve_it():
    # Two free orgs hold the pool and have queued for twenty minutes; free never
    # preempts, so the round places nothing and reaches no job. A newcomer's one job will
    # get the next GPU that frees up (fair share), so it stands first and expects that
    # GPU, not the end of the floods' backlog as submission order would have it.
    pool, held = pair_held("free", ("flood-a", "flood-b"))
    queue = [
        job(f"{org}-{n}", tier="free", org=org, submitted_at=NOW - 1200 + n, max_runtime_s=100)
        for org in ("flood-a", "flood-b")
        for n in range(20)
    ]
    queue.append(job("newcomer", tier="free", org="newcomer", submitted_at=NOW - 1))
    waiting = waiting_of(schedule_round(snapshot([pool], queue, running=held, now=NOW)))
    assert (waiting["newcomer"].position, waiting["newcomer"].estimated_start) == (1, NOW + 100)
    # The floods' jobs follow, in turn between the two orgs, each oldest first.
    assert waiting["flood-a-0"].position < waiting["flood-a-1"].position
    assert {waiting["flood-a-0"].position, waiting["flood-b-0"].position} == {2, 3}


def test_observed_runtimes_shorten_the_estimate():
    pool = node("solo", gpus=1)
    busy = allocation("r", pool, [0], tier="paid", org="x", started_at=NOW, max_runtime_s=100)
    snap = snapshot([pool], [job("mine", submitted_at=NOW)], running=[busy], now=NOW)
    snap.runtime_ratio = 0.25
    assert waiting_of(schedule_round(snap))["mine"].estimated_start == NOW + 25


def test_observed_runtime_ratios_are_the_median_and_the_75th_percentile_interpolated():
    ran = [0.2, 0.4, 0.6, 0.8]
    assert observed_runtime_ratios(ran, min_samples=4) == pytest.approx((0.5, 0.65))


def test_observed_runtime_ratios_stay_within_a_thousandth_and_the_whole_runtime():
    # A job that ran past its max runtime (the grace to stop) or for no time at all.
    assert observed_runtime_ratios([0.0, 0.0, 1.4], min_samples=1) == (
        0.001,
        pytest.approx(0.5005),
    )


def test_ten_second_jobs_under_an_hours_limit_are_expected_to_run_ten_seconds():
    # Generous limits are the norm: a floor of 1 % read these as 36 s jobs, and a job
    # hundreds deep in the queue expected to start three times later than it did.
    ran = [10.4 / 3600] * 10
    typical, late = observed_runtime_ratios(ran, min_samples=10)
    assert typical * 3600 == pytest.approx(10.4)
    assert late * 3600 == pytest.approx(10.4)


def test_one_short_finished_job_does_not_make_every_running_job_look_about_to_end():
    assert observed_runtime_ratios([], min_samples=10) == (1.0, 1.0)
    assert observed_runtime_ratios([0.02] * 9, min_samples=10) == (1.0, 1.0)
    assert observed_runtime_ratios([0.02] * 10, min_samples=10) == (0.02, 0.02)


def test_observed_runtime_ratios_are_read_for_each_tier_from_its_own_attempts():
    ran = [("free", 0.5)] * 10 + [("enterprise", 0.02)] * 10 + [("paid", 0.3)] * 4
    assert observed_runtime_ratios_by_tier(ran, min_samples=10) == {
        "free": (0.5, 0.5),
        "enterprise": (0.02, 0.02),
        "paid": (0.3, 1.0),  # four of its own set its estimates, not its hold-back
    }


def test_a_tier_with_under_three_finished_jobs_estimates_from_every_tiers_jobs():
    # A new platform: five enterprise jobs ran a fiftieth of their limit, one paid job
    # has finished. Paid's estimates take the median of all six, not the whole limit;
    # its preemption hold-back still expects the whole limit.
    ran = [("enterprise", 0.02)] * 5 + [("paid", 0.05)]
    ratios = observed_runtime_ratios_by_tier(ran, min_samples=10)
    assert ratios["paid"] == (0.02, 1.0)
    assert ratios["free"] == (0.02, 1.0)
    assert ratios["enterprise"] == (0.02, 1.0)


def test_with_under_three_finished_jobs_in_all_every_job_expects_its_whole_limit():
    ratios = observed_runtime_ratios_by_tier([("enterprise", 0.02)] * 2, min_samples=10)
    assert set(ratios.values()) == {(1.0, 1.0)}


def test_three_finished_jobs_set_the_estimates_and_ten_the_preemption_hold_back():
    # A new platform: the estimates use what three jobs ran; preemptions wait for ten,
    # so that a few short jobs never make every running job look about to end.
    ran = [("paid", 10 / 600)] * 3
    typical, late = observed_runtime_ratios_by_tier(ran, min_samples=10)["paid"]
    assert typical * 600 == pytest.approx(10)
    assert late == 1.0


def test_an_enterprise_job_behind_preemptible_free_work_expects_the_preemption_not_its_end():
    pool = node("solo", gpus=1)
    long_free = allocation(
        "f", pool, [0], tier="free", org="f", started_at=NOW - 10, max_runtime_s=3600
    )
    queue = [job("vip", tier="enterprise", org="e", submitted_at=NOW, max_runtime_s=60)]
    result = schedule_round(snapshot([pool], queue, running=[long_free], now=NOW))
    assert result.decisions == []  # not yet past its preemption wait
    config = PolicyConfig()
    wait, grace = config.preemption_wait_s["enterprise"], config.preemption_grace_s
    assert waiting_of(result)["vip"].estimated_start == NOW + wait + grace + 1


def test_one_preemptible_gpu_brings_forward_only_the_first_of_two_enterprise_jobs():
    pool = node("pair", gpus=2)
    running = [
        allocation("f", pool, [0], tier="free", org="f", started_at=NOW, max_runtime_s=3600),
        allocation(
            "p",
            pool,
            [1],
            tier="paid",
            org="p",
            started_at=NOW,
            max_runtime_s=100,
            preemptible=False,
        ),
    ]
    queue = [
        job("first", tier="enterprise", org="e", submitted_at=NOW, max_runtime_s=60),
        job("second", tier="enterprise", org="e", submitted_at=NOW + 0.5, max_runtime_s=60),
    ]
    waiting = waiting_of(schedule_round(snapshot([pool], queue, running=running, now=NOW)))
    config = PolicyConfig()
    by_preemption = NOW + config.preemption_wait_s["enterprise"] + config.preemption_grace_s + 1
    assert waiting["first"].estimated_start == by_preemption
    assert waiting["second"].estimated_start == NOW + 100  # the paid job's end


def test_a_free_job_expects_its_wait_stretched_by_the_work_higher_tiers_bring():
    pool = node("pair", gpus=2)
    busy = [
        allocation(f"r{i}", pool, [i], tier="free", org="x", started_at=NOW, max_runtime_s=100)
        for i in (0, 1)
    ]
    queue = [job("mine", tier="free", org="me", submitted_at=NOW, max_runtime_s=60)]
    half_life = PolicyConfig().usage_half_life_s
    # Lately, enterprise and paid held one GPU of the two between them.
    usage = UsageSnapshot(
        by_tier={
            "enterprise": 0.25 * half_life / math.log(2),
            "paid": 0.75 * half_life / math.log(2),
        }
    )
    quiet = schedule_round(snapshot([pool], queue, running=busy, now=NOW))
    busy_above = schedule_round(snapshot([pool], queue, running=busy, now=NOW, usage=usage))
    assert waiting_of(quiet)["mine"].estimated_start == NOW + 100
    assert waiting_of(busy_above)["mine"].estimated_start == pytest.approx(NOW + 150)


def test_a_job_no_node_can_hold_has_no_estimate():
    queue = [job("huge", gpus=8, types=("H100",))]
    waiting = waiting_of(schedule_round(snapshot([node("small", gpus=4)], queue, now=NOW)))
    assert waiting["huge"].estimated_start is None
    assert waiting["huge"].public_reason == "no active node has 8 GPUs of H100 on one node"


def test_a_job_wider_than_every_node_has_no_estimate_though_the_fleet_has_enough_gpus():
    # Eight H100s in all, four per node: six on one node never come free.
    nodes = [node("left", gpus=4), node("right", gpus=4)]
    queue = [
        job("wide", tier="paid", gpus=6, types=("H100",), submitted_at=NOW - 10),
        job("narrow", tier="paid", gpus=4, types=("H100",), submitted_at=NOW - 5),
    ]
    busy = [
        allocation(
            f"r{i}",
            pool,
            list(range(4)),
            tier="enterprise",
            org="e",
            started_at=NOW,
            max_runtime_s=100,
            preemptible=False,
        )
        for i, pool in enumerate(nodes)
    ]
    waiting = waiting_of(schedule_round(snapshot(nodes, queue, running=busy, now=NOW)))
    assert (waiting["wide"].position, waiting["wide"].estimated_start) == (None, None)
    assert waiting["wide"].public_reason == "no active node has 6 GPUs of H100 on one node"
    # The wide job holds no GPUs in the schedule and stands ahead of no one: the narrow
    # one is next and expects the first node.
    assert (waiting["narrow"].position, waiting["narrow"].estimated_start) == (1, NOW + 100)


def test_jobs_the_round_did_not_reach_each_read_the_reason_of_their_own_shape():
    # A full fleet and nobody past a preemption threshold: the round reaches no one, and
    # each job's reason comes from its shape alone (worked out once per shape).
    pool = node("h", gpus=4)
    busy = allocation(
        "r", pool, range(4), tier="enterprise", org="e", started_at=NOW, preemptible=False
    )
    queue = [
        job("one", tier="paid", org="a", gpus=1, types=("H100",), submitted_at=NOW - 2),
        job("pair", tier="paid", org="a", gpus=2, types=("H100",), submitted_at=NOW - 2),
        job("wide", tier="paid", org="b", gpus=8, types=("H100",), submitted_at=NOW - 2),
        job("stuck", tier="free", org="c", gpus=4, preemptible=False, submitted_at=NOW - 2),
        job("twin", tier="paid", org="d", gpus=1, types=("H100",), submitted_at=NOW - 1),
    ]
    result = schedule_round(snapshot([pool], queue, running=[busy], now=NOW))
    assert result.decisions == []
    reasons = {job_id: w.public_reason for job_id, w in waiting_of(result).items()}
    assert reasons["one"] == reasons["twin"] == "waiting for an H100: 4 of 4 busy"
    assert reasons["pair"] == "waiting for 2 H100 GPUs: 4 of 4 busy"
    assert reasons["wide"] == "no active node has 8 GPUs of H100 on one node"
    assert reasons["stuck"].startswith("a job that cannot be preempted runs within its tier")


def test_a_job_that_cannot_be_preempted_waits_for_its_tier_share():
    # Ten GPUs: free keeps 8 (80 %) and holds them; two are idle.
    pool = node("n10", gpus=10)
    held = [
        allocation(f"f{i}", pool, [i], tier="free", org="f", started_at=NOW - 10, max_runtime_s=100)
        for i in range(8)
    ]
    queue = [job("pinned", tier="free", org="me", preemptible=False)]
    waiting = waiting_of(schedule_round(snapshot([pool], queue, running=held, now=NOW)))
    assert "its tier's share" in waiting["pinned"].public_reason
    # Two GPUs are idle, but it starts only when a free job gives one back.
    assert (waiting["pinned"].position, waiting["pinned"].estimated_start) == (1, NOW + 90)


def test_a_job_that_cannot_be_preempted_and_exceeds_its_tier_share_has_no_estimate():
    # Free's ceiling on one GPU is 0.8 of it: a job that cannot borrow never starts here,
    # and an estimate would slide forward every tick.
    queue = [
        job("pinned", tier="free", org="me", submitted_at=NOW - 10, preemptible=False),
        job("after", tier="free", org="me", submitted_at=NOW - 5),
    ]
    result = schedule_round(snapshot([node("solo", gpus=1)], queue, now=NOW))
    pinned = waiting_of(result)["pinned"]
    assert (pinned.position, pinned.estimated_start) == (None, None)
    assert pinned.public_reason == (
        "a job that cannot be preempted runs within its tier's share of the fleet: 80% of "
        "1 GPU here, less than the 1 GPU it needs; a preemptible job may use idle GPUs "
        "beyond it"
    )
    assert "ceiling of 0.8" in pinned.reason
    # It stands ahead of no one: the preemptible job behind it borrows the idle GPU.
    assert [p.job_id for p in result.decisions if isinstance(p, Place)] == ["after"]


def test_the_tenant_reason_names_no_other_tenant_and_no_score():
    pool = node("solo", gpus=1)
    fresh = allocation(
        "theirs",
        pool,
        [0],
        tier="free",
        org="their-org",
        user="their-user",
        started_at=NOW - 1,
        job_id="their-job",
    )
    queue = [
        job("urgent", tier="enterprise", org="me", submitted_at=NOW - 6),
        job("later", tier="paid", org="me", submitted_at=NOW - 1),
    ]
    result = schedule_round(snapshot([pool], queue, running=[fresh], now=NOW))
    for waiting in result.waiting:
        for secret in ("their", "fair share", "0."):
            assert secret not in waiting.public_reason, waiting
    assert "their-job" in waiting_of(result)["urgent"].reason  # operators see it all


@pytest.mark.parametrize("explain", [True, False])
def test_explaining_changes_no_decision(explain):
    pool = node("n8")
    queue = [job(f"j{i}", gpus=3, submitted_at=i) for i in range(5)]
    snap = snapshot([pool], queue, now=NOW)
    assert schedule_round(snap, explain=explain).decisions == schedule(snap)


def test_on_a_full_fleet_each_orgs_next_job_stands_among_the_first_in_line():
    # Ten busy GPUs, each held by one of ten orgs; sixteen orgs queue hundreds of jobs
    # each. The round places nothing and so charges no one: it looks at every job of
    # the six orgs holding no GPU first. Served as GPUs free up, every org's next job
    # is among the first sixteen or so, and each estimate is a job's runtime or two away.
    pools = [node("h", "H100", gpus=4), node("a1", "A100", gpus=4), node("a2", "A100", gpus=2)]
    gpus = [(pool, i) for pool in pools for i in range(len(pool.gpus))]
    running = [
        allocation(
            f"r{k}",
            pool,
            [i],
            tier="enterprise",
            org=f"o{k}",
            user=f"u{k}",
            started_at=NOW - 5,
            max_runtime_s=3600,
        )
        for k, (pool, i) in enumerate(gpus)
    ]
    queue = [
        job(
            f"j{i}",
            tier="enterprise",
            org=f"o{i % 16}",
            user=f"u{i % 16}",
            submitted_at=NOW - 900 + i * 0.01,
            types=("H100", "A100"),
            gpus=1 + (i % 7 == 0),
        )
        for i in range(16 * 40)
    ]
    snap = snapshot(pools, queue, running=running, now=NOW)
    snap.runtime_ratio = snap.late_runtime_ratio = 10 / 3600
    waiting = waiting_of(schedule_round(snap))
    heads = [waiting[f"j{o}"] for o in range(16)]
    assert max(head.position for head in heads) <= 18
    assert max(head.estimated_start for head in heads) <= NOW + 30
