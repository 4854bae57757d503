"""Work conservation and preemption on small pools: the promises hold on one GPU too."""

from apps.scheduler.policy import Place, PolicyConfig, Preempt, schedule
from apps.scheduler.policy.builders import allocation, job, node, snapshot

NOW = 1000.0


def places(decisions):
    return [d for d in decisions if isinstance(d, Place)]


def preempts(decisions):
    return [d for d in decisions if isinstance(d, Preempt)]


def one_gpu_pool():
    return node("solo", gpus=1)


def test_a_free_job_alone_on_a_one_gpu_pool_is_placed_at_once():
    decisions = schedule(snapshot([one_gpu_pool()], [job("f", tier="free")], now=NOW))
    assert [d.job_id for d in places(decisions)] == ["f"]
    assert "borrows idle GPUs beyond the free tier's ceiling" in decisions[0].reason


def test_a_free_eight_gpu_job_on_an_idle_eight_gpu_node_is_placed():
    decisions = schedule(snapshot([node("n8")], [job("big", tier="free", gpus=8)], now=NOW))
    assert [(d.job_id, len(d.gpu_ids)) for d in places(decisions)] == [("big", 8)]


def test_a_job_that_cannot_be_preempted_never_borrows_beyond_its_tier_ceiling():
    pinned = job("pinned", tier="free", preemptible=False)
    assert places(schedule(snapshot([one_gpu_pool()], [pinned], now=NOW))) == []
    # On ten GPUs the free tier keeps 8 (80 %): the ninth non-preemptible job waits.
    queue = [job(f"p{i}", tier="free", submitted_at=i, preemptible=False) for i in range(10)]
    assert len(places(schedule(snapshot([node("n10", gpus=10)], queue, now=NOW)))) == 8


def test_an_enterprise_job_preempts_a_free_job_that_started_a_second_ago():
    pool = one_gpu_pool()
    fresh = allocation("fresh", pool, [0], tier="free", org="f", started_at=NOW - 1)
    urgent = job("urgent", tier="enterprise", org="e", submitted_at=NOW - 6)
    decisions = schedule(snapshot([pool], [urgent], running=[fresh], now=NOW))
    [preempt] = preempts(decisions)
    assert (preempt.for_job_id, preempt.allocation_ids) == ("urgent", ("fresh",))


def test_enterprise_waits_its_threshold_before_preempting():
    pool = one_gpu_pool()
    fresh = allocation("fresh", pool, [0], tier="free", org="f", started_at=NOW - 1)
    threshold = PolicyConfig().preemption_wait_s["enterprise"]
    urgent = job("urgent", tier="enterprise", org="e", submitted_at=NOW - threshold + 0.5)
    assert preempts(schedule(snapshot([pool], [urgent], running=[fresh], now=NOW))) == []


def test_a_borrowed_gpu_is_reclaimed_when_another_tier_waits():
    pool = one_gpu_pool()
    borrowed = allocation("borrowed", pool, [0], tier="free", org="f", started_at=NOW - 100)
    # Paid preempts only after 60 s by its threshold; reclaiming a borrowed GPU takes 5 s.
    paid = job("paid", tier="paid", org="p", submitted_at=NOW - 10)
    [preempt] = preempts(schedule(snapshot([pool], [paid], running=[borrowed], now=NOW)))
    assert preempt.allocation_ids == ("borrowed",)
    assert "reclaim" in preempt.reason


def test_reclaim_leaves_the_lender_its_ceiling():
    # Ten GPUs, free ceiling 80 %: free holds 9 (one borrowed), one GPU is idle.
    pool = node("n10", gpus=10)
    held = [
        allocation(f"f{i}", pool, [i], tier="free", org="f", started_at=NOW - 100) for i in range(9)
    ]
    # Three GPUs would take free down to 7: paid waits for its own threshold instead.
    three = job("paid", tier="paid", org="p", gpus=3, submitted_at=NOW - 10)
    assert preempts(schedule(snapshot([pool], [three], running=held, now=NOW))) == []
    # Two GPUs: the idle one and the borrowed one.
    two = job("paid", tier="paid", org="p", gpus=2, submitted_at=NOW - 10)
    [preempt] = preempts(schedule(snapshot([pool], [two], running=held, now=NOW)))
    assert len(preempt.allocation_ids) == 1


def test_a_job_within_its_ceiling_is_not_reclaimed():
    pool = node("n10", gpus=10)
    held = [
        allocation(f"p{i}", pool, [i], tier="paid", org="p", started_at=NOW - 100)
        for i in range(10)
    ]
    free = job("free", tier="free", org="f", submitted_at=NOW - 500)
    assert preempts(schedule(snapshot([pool], [free], running=held, now=NOW))) == []


def test_the_cap_still_stops_a_third_preemption_on_a_small_pool():
    pool = one_gpu_pool()
    capped = PolicyConfig().max_preemptions_per_job
    twice = allocation("twice", pool, [0], tier="free", org="f", preemptions=capped)
    urgent = job("urgent", tier="enterprise", org="e", submitted_at=NOW - 60)
    assert preempts(schedule(snapshot([pool], [urgent], running=[twice], now=NOW))) == []
