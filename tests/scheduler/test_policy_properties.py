"""Property test: on random snapshots, decisions never double-book, never use a busy GPU,
never split a job, and never preempt what may not be preempted."""

import copy
import math
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.scheduler.policy import (
    TIER_RANK,
    TIERS,
    NodeState,
    Place,
    PolicyConfig,
    Preempt,
    Reserve,
    queue_window,
    schedule,
    schedule_round,
)
from apps.scheduler.policy.builders import DEFAULT_GPU_TYPES, allocation, job, node, snapshot
from apps.scheduler.policy.fairshare import FairShareQueue, RunningGpus, oldest_unclaimed_at_most

NOW = 10_000.0
MEMORY = {t.name: t.memory_gb for t in DEFAULT_GPU_TYPES}
TYPE_CHOICES = [(), ("H100",), ("A100",), ("H100", "A100"), ("A100", "H100")]


@st.composite
def snapshots(draw):
    fleet = []
    for i in range(draw(st.integers(1, 4))):
        state = draw(st.sampled_from([NodeState.ACTIVE] * 4 + [NodeState.DRAINING, NodeState.DOWN]))
        fleet.append(
            node(f"n{i}", draw(st.sampled_from(["H100", "A100"])), draw(st.integers(1, 8)), state)
        )
    running, serial = [], 0
    for on in fleet:
        free = list(range(len(on.gpus)))
        while free and draw(st.booleans()):
            size = draw(st.integers(1, len(free)))
            taken, free = free[:size], free[size:]
            serial += 1
            started = draw(st.floats(0, NOW))
            running.append(
                allocation(
                    f"a{serial}",
                    on,
                    taken,
                    tier=draw(st.sampled_from(TIERS)),
                    org=draw(st.sampled_from(["o1", "o2", "o3"])),
                    started_at=started,
                    max_runtime_s=draw(st.floats(1, 5000)),
                    preemptible=draw(st.booleans()),
                    last_checkpoint_at=draw(st.none() | st.floats(started, NOW)),
                    preemptions=draw(st.integers(0, 3)),
                    stopping=draw(st.booleans()),
                )
            )
        if free and draw(st.booleans()):
            on.gpus[free[0]].free = False  # busy without a known allocation
    queue = [
        job(
            f"j{i}",
            tier=draw(st.sampled_from(TIERS)),
            org=draw(st.sampled_from(["o1", "o2", "o3", "o4"])),
            user=draw(st.sampled_from(["u1", "u2"])),
            gpus=draw(st.sampled_from([1, 1, 2, 4, 8])),
            submitted_at=draw(st.floats(0, NOW)),
            max_runtime_s=draw(st.floats(1, 5000)),
            types=draw(st.sampled_from(TYPE_CHOICES)),
            min_memory_gb=draw(st.sampled_from([0, 0, 40, 80])),
            claimed_node=draw(st.none() | st.sampled_from([n.name for n in fleet])),
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    config = PolicyConfig(
        tier_floors={t: draw(st.sampled_from([0.0, 0.05, 0.2])) for t in TIERS},
        tier_ceilings={t: draw(st.sampled_from([1.0, 1.0, 0.5])) for t in TIERS},
        preemption_wait_s={"enterprise": 1.0, "paid": 30.0, "free": None},
        min_runtime_before_preemption_s=draw(st.sampled_from([0.0, 60.0])),
        reserved_node_share=draw(st.sampled_from([0.0, 0.5, 1.0])),
    )
    weights = {org: draw(st.sampled_from([0.5, 1.0, 3.0])) for org in ["o1", "o2", "o3", "o4"]}
    return snapshot(fleet, queue, running=running, now=NOW, config=config, org_weights=weights)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_decisions_respect_the_invariants_of_the_cluster(snap):
    before = copy.deepcopy(snap)
    decisions = schedule(snap)
    assert snap == before, "the policy must not modify its snapshot"

    gpus = {gpu.id: (n, gpu) for n in snap.nodes for gpu in n.gpus}
    held = {gpu_id for a in snap.running for gpu_id in a.gpu_ids}
    jobs = {j.id: j for j in snap.queued}
    allocations = {a.id: a for a in snap.running}
    config = snap.config

    capacity = sum(len(n.gpus) for n in snap.nodes if n.state == NodeState.ACTIVE)
    held_by_tier = dict.fromkeys(TIERS, 0)
    for running in snap.running:
        held_by_tier[running.tier] = held_by_tier.get(running.tier, 0) + running.gpu_count
    borrowing = {  # tiers beyond their ceiling (in whole GPUs) before the round
        tier
        for tier, held in held_by_tier.items()
        if held > math.floor(config.tier_ceilings[tier] * capacity + 1e-9)
    }

    given_gpus, placed_jobs, victims = set(), set(), set()
    for decision in decisions:
        if isinstance(decision, Place):
            queued = jobs[decision.job_id]
            held_by_tier[queued.tier] += queued.gpu_count
            if not queued.preemptible:
                assert held_by_tier[queued.tier] <= (
                    config.tier_ceilings[queued.tier] * capacity + 1e-9
                ), "a job that cannot be preempted never borrows beyond its tier's ceiling"
            assert decision.job_id not in placed_jobs, "a job is placed at most once"
            placed_jobs.add(decision.job_id)
            assert len(decision.gpu_ids) == queued.gpu_count
            for gpu_id in decision.gpu_ids:
                assert gpu_id not in given_gpus, "a GPU goes to at most one job"
                given_gpus.add(gpu_id)
                on, gpu = gpus[gpu_id]
                assert on.name == decision.node, "a job's GPUs are all on one node"
                assert on.state == NodeState.ACTIVE
                assert gpu.free and gpu_id not in held, "only free GPUs are handed out"
                assert gpu.type == decision.gpu_type
            assert not queued.gpu_types or decision.gpu_type in queued.gpu_types
            assert MEMORY[decision.gpu_type] >= queued.min_gpu_memory_gb
        elif isinstance(decision, Preempt):
            claimant = jobs[decision.for_job_id]
            assert decision.for_job_id not in placed_jobs
            for allocation_id in decision.allocation_ids:
                victim = allocations[allocation_id]
                assert allocation_id not in victims
                victims.add(allocation_id)
                assert victim.node == decision.node
                assert victim.preemptible and not victim.stopping
                assert (
                    TIER_RANK[victim.tier] < TIER_RANK[claimant.tier]
                    or (victim.tier == claimant.tier and victim.org != claimant.org)
                    or victim.tier in borrowing
                )
                assert victim.preemptions < config.max_preemptions_per_job
                assert NOW - victim.started_at >= config.min_runtime_before_preemption_s
                assert not any(a.stopping for a in snap.running if a.node == decision.node), (
                    "a node already being freed is not targeted again"
                )
        else:
            assert isinstance(decision, Reserve)
            assert jobs[decision.job_id].gpu_count > 1
    for decision in decisions:
        if isinstance(decision, Reserve):
            assert decision.job_id not in placed_jobs or any(
                isinstance(d, Place) and d.job_id == decision.job_id for d in decisions
            )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.integers(1, 3), st.integers(3, 12))
def test_the_queue_window_with_its_backlog_decides_like_the_whole_queue(snap, depth, cap):
    # What the dispatcher and the simulator list (each user's first jobs, of at most
    # `cap` users, the rest as backlog) leads to the very decisions the whole queue would.
    snap.config = replace(
        snap.config, queue_depth_per_user=depth, queue_window_jobs=0, queue_window_max_jobs=cap
    )
    window = queue_window(snap.queued, snap.config)
    windowed = replace(snap, queued=window.listed, backlog=window.backlog)
    assert schedule(windowed) == schedule(snap)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_waiting_jobs_are_explained_without_naming_anyone(snap):
    result = schedule_round(snap)
    placed = {d.job_id for d in result.decisions if isinstance(d, Place)}
    assert {w.job_id for w in result.waiting} == {j.id for j in snap.queued} - placed
    names = {j.org for j in snap.queued} | {a.org for a in snap.running}
    names |= {j.user for j in snap.queued} | {a.user for a in snap.running}
    names |= {str(j.id) for j in snap.queued} | {str(a.job_id) for a in snap.running}
    for waiting in result.waiting:
        words = set(waiting.public_reason.replace(":", " ").replace(",", " ").split())
        assert not words & names, waiting.public_reason
        assert waiting.position is None or waiting.position >= 1
        assert waiting.estimated_start is None or waiting.estimated_start >= snap.now


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.integers(1, 3), st.integers(3, 12))
def test_a_full_fleet_asks_the_cheap_bound_before_the_queue_and_decides_the_same(snap, depth, cap):
    # The round skips the fair-share queue when no queued job at all has waited long
    # enough to preempt: that bound is never younger than the window's oldest, whatever
    # the window leaves out, so the skip changes no decision.
    snap.config = replace(
        snap.config, queue_depth_per_user=depth, queue_window_jobs=0, queue_window_max_jobs=cap
    )
    queue = FairShareQueue(
        snap.queued,
        capacity_gpus=sum(len(n.gpus) for n in snap.nodes),
        config=snap.config,
        org_weights=snap.org_weights,
        usage=snap.usage,
        running=RunningGpus.of(snap.running),
        now=snap.now,
    )
    bound = oldest_unclaimed_at_most(snap.queued)
    for tier, oldest in queue.oldest_unclaimed.items():
        assert bound[tier] <= oldest
    # Every GPU busy: nothing is placed, and every queued job is still explained.
    for on in snap.nodes:
        for gpu in on.gpus:
            gpu.free = False
    result = schedule_round(snap)
    assert all(not isinstance(d, Place) for d in result.decisions)
    assert {w.job_id for w in result.waiting} == {j.id for j in snap.queued}
