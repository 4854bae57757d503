"""Dispatch tick on real PostgreSQL: placements, audit, drain, backoff, gangs, preemption."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.models import Tier
from apps.fleet.models import Node, NodeState
from apps.fleet.services import drain_node
from apps.jobs.models import Attempt, AttemptState, GpuAssignment, Job, JobEvent, JobStatus
from apps.jobs.services import attempts
from apps.scheduler.models import DecisionKind, DecisionOutcome, DispatchDecision, NodeClaim
from apps.scheduler.policy import Place, schedule
from apps.scheduler.services.dispatch import (
    BUSY_PACE_S,
    FIRST_GROUP,
    PLACEMENTS_PER_TRANSACTION,
    _group_size,
    apply_placement,
    apply_placements,
    run_dispatch_tick,
)
from apps.scheduler.services.recovery import requeue_attempt
from apps.scheduler.services.snapshot import build_snapshot
from tests.conftest import client_with
from tests.factories import OrgFactory, operator_key, org_key
from tests.scheduler.factories import (
    A100_PRICE,
    H100_PRICE,
    JobFactory,
    NodeFactory,
    dispatch_ticks,
    live_attempt,
    queued_since,
    start_attempt,
)

pytestmark = pytest.mark.django_db


def test_tick_places_a_queued_job_with_attempt_lease_token_and_assigned_gpus():
    node = NodeFactory(gpus=2)
    job = JobFactory(gpu_count=2)

    result = run_dispatch_tick()

    assert result.ran and result.placed == 1
    job.refresh_from_db()
    assert job.status == JobStatus.SCHEDULED
    assert job.attempt_count == 1
    assert job.gpu_type == "H100"
    attempt = Attempt.objects.get(job=job)
    assert attempt.number == 1
    assert attempt.node == node
    assert attempt.state == AttemptState.SCHEDULED
    assert attempt.gpu_type == "H100"
    assert attempt.price_per_gpu_hour == H100_PRICE
    assert attempt.gpu_indices == [0, 1]
    assert attempt.devices == f"GPU-{node.name}-0,GPU-{node.name}-1"
    assert attempt.fencing_token > 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        db_now = cursor.fetchone()[0]
    assert attempt.lease_expires_at > db_now  # claimable for the scheduling lease
    live = GpuAssignment.objects.filter(attempt=attempt, released_at__isnull=True)
    assert sorted(live.values_list("gpu__index", flat=True)) == [0, 1]
    event = JobEvent.objects.get(job=job, to_status=JobStatus.SCHEDULED)
    assert event.attempt_id == attempt.id and event.actor == "scheduler"
    assert node.name in event.reason
    audit = DispatchDecision.objects.get(job=job)
    assert (audit.kind, audit.outcome) == (DecisionKind.PLACE, DecisionOutcome.APPLIED)
    assert audit.attempt_id == attempt.id and audit.gpu_indices == [0, 1]
    assert audit.reason  # the policy's explanation, for operators


def test_fencing_tokens_grow_across_placements():
    NodeFactory(gpus=4)
    jobs = [JobFactory() for _ in range(4)]

    run_dispatch_tick()

    attempts = Attempt.objects.filter(job__in=jobs).order_by("created_at", "fencing_token")
    tokens = list(attempts.values_list("fencing_token", flat=True))
    assert len(tokens) == 4 and len(set(tokens)) == 4
    JobFactory()
    NodeFactory(gpus=1)
    run_dispatch_tick()
    newest = Attempt.objects.order_by("-created_at").first()
    assert newest.fencing_token > max(tokens)


def test_a_multi_gpu_job_gets_all_its_gpus_on_one_node():
    small = NodeFactory(gpus=2)
    big = NodeFactory(gpus=4)
    job = JobFactory(gpu_count=4)

    run_dispatch_tick()

    attempt = Attempt.objects.get(job=job)
    assert attempt.node == big
    nodes = set(GpuAssignment.objects.filter(attempt=attempt).values_list("gpu__node", flat=True))
    assert nodes == {big.pk}
    assert not GpuAssignment.objects.filter(gpu__node=small).exists()


def test_draining_a_node_stops_new_placements_there():
    drained = NodeFactory(gpus=4)
    drain_node(name=drained.name)
    JobFactory()

    result = run_dispatch_tick()

    assert result.placed == 0
    assert not Attempt.objects.exists()
    other = NodeFactory(gpus=1)
    run_dispatch_tick()
    assert Attempt.objects.get().node == other


def test_a_placement_on_a_node_drained_after_the_snapshot_is_skipped():
    node = NodeFactory(gpus=1)
    job = JobFactory()
    gpu_id = node.gpus.get().pk
    decision = Place(job_id=job.pk, node=node.name, gpu_ids=(gpu_id,), gpu_type="H100", reason="x")
    drain_node(name=node.name)

    outcome = apply_placement(decision, tick=uuid.uuid4())

    assert outcome.outcome == DecisionOutcome.SKIPPED
    assert "draining" in outcome.skip_reason
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert not Attempt.objects.exists() and not GpuAssignment.objects.exists()
    audit = DispatchDecision.objects.get(job=job)
    assert audit.outcome == DecisionOutcome.SKIPPED and "draining" in audit.skip_reason


def test_a_job_in_retry_backoff_waits_for_not_before():
    NodeFactory(gpus=1)
    waiting = JobFactory(not_before=timezone.now() + timedelta(hours=1))

    run_dispatch_tick()

    waiting.refresh_from_db()
    assert waiting.status == JobStatus.QUEUED
    Job.objects.filter(pk=waiting.pk).update(not_before=timezone.now() - timedelta(seconds=1))
    run_dispatch_tick()
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.SCHEDULED


def test_any_type_job_is_placed_on_the_cheaper_type_at_its_price():
    NodeFactory(gpus=1, gpus__type="H100")
    a100 = NodeFactory(gpus=1, gpus__type="A100")
    job = JobFactory(gpu_types=[])

    run_dispatch_tick()

    attempt = Attempt.objects.get(job=job)
    assert (attempt.node, attempt.gpu_type, attempt.price_per_gpu_hour) == (
        a100,
        "A100",
        A100_PRICE,
    )


def test_memory_floor_keeps_a_job_off_small_gpus():
    NodeFactory(gpus=1, gpus__type="A100")
    job = JobFactory(gpu_types=[], min_gpu_memory_gb=80)

    run_dispatch_tick()

    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED


def test_when_gpus_run_out_the_rest_stays_queued():
    NodeFactory(gpus=2)
    jobs = [JobFactory() for _ in range(5)]

    result = run_dispatch_tick()

    assert result.placed == 2
    statuses = Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    assert sorted(statuses) == ["queued"] * 3 + ["scheduled"] * 2
    assert run_dispatch_tick().placed == 0  # nothing freed: nothing placed


def test_a_tick_past_its_apply_budget_leaves_the_rest_to_a_round_sent_at_once(
    settings, control_queue
):
    settings.GANTRY_DISPATCH_APPLY_BUDGET_S = 0  # every tick applies its first group only
    NodeFactory(gpus=8)
    jobs = [JobFactory() for _ in range(FIRST_GROUP + 2)]

    first = run_dispatch_tick()

    assert (first.placed, first.deferred) == (FIRST_GROUP, 2)
    assert DispatchDecision.objects.count() == FIRST_GROUP  # what was not applied: no row
    assert len(dispatch_ticks(control_queue)) == 1  # the next round is on its way
    assert [run_dispatch_tick().placed for _ in range(2)] == [2, 0]
    statuses = Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
    assert list(statuses) == [JobStatus.SCHEDULED] * (FIRST_GROUP + 2)


def test_an_enterprise_job_submitted_while_a_paid_burst_is_placed_goes_first_in_the_next_round(
    settings,
):
    settings.GANTRY_DISPATCH_APPLY_BUDGET_S = 0
    NodeFactory(gpus=FIRST_GROUP)
    NodeFactory(gpus=1)  # room for one more job than the first group places
    paid = OrgFactory(tier=Tier.PAID)
    burst = [queued_since(600 - i, org=paid) for i in range(FIRST_GROUP + 6)]
    assert run_dispatch_tick().placed == FIRST_GROUP  # the rest waits for the next round

    urgent = JobFactory(org=OrgFactory(tier=Tier.ENTERPRISE))
    second = run_dispatch_tick()

    assert second.placed == 1
    urgent.refresh_from_db()
    assert urgent.status == JobStatus.SCHEDULED
    waiting = Job.objects.filter(pk__in=[j.pk for j in burst], status=JobStatus.QUEUED)
    assert waiting.count() == 6


def test_placement_groups_fit_what_is_left_of_the_budget_at_the_last_groups_pace():
    assert _group_size(None, 0.0, None) == PLACEMENTS_PER_TRANSACTION  # no budget
    assert _group_size(2.0, 0.0, None) == FIRST_GROUP  # the pace is not known yet
    assert _group_size(2.0, 0.5, 0.003) == PLACEMENTS_PER_TRANSACTION  # an idle host
    assert _group_size(2.0, 0.5, 0.01) == 16  # 1.5 s at 10 ms a placement: the cap
    assert _group_size(2.0, 1.95, 0.01) == 5  # what is left of the budget
    assert _group_size(2.0, 1.999, 0.01) == 1  # at least one
    assert _group_size(2.0, 0.5, BUSY_PACE_S) == 1  # a host busy running jobs: one at a time


def test_the_placements_of_a_round_are_written_together_in_as_many_statements_for_2_as_for_20():
    for _ in range(3):
        NodeFactory(gpus=8)

    def statements_to_place(count: int) -> int:
        jobs = [JobFactory() for _ in range(count)]
        decisions = schedule(build_snapshot().cluster)
        assert len(decisions) == count
        with CaptureQueriesContext(connection) as queries:
            outcomes = apply_placements(decisions, tick=uuid.uuid4())
        assert [o.outcome for o in outcomes] == [DecisionOutcome.APPLIED] * count
        statuses = Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("status", flat=True)
        assert set(statuses) == {JobStatus.SCHEDULED}
        assert Attempt.objects.filter(job__in=jobs).count() == count
        assert GpuAssignment.objects.filter(attempt__job__in=jobs).count() == count
        events = JobEvent.objects.filter(job__in=jobs, to_status=JobStatus.SCHEDULED)
        assert events.count() == count
        return len(queries)

    assert statements_to_place(2) == statements_to_place(20)


def test_a_refused_placement_sends_its_group_back_one_by_one_and_the_others_still_start():
    node = NodeFactory(gpus=4)
    jobs = [JobFactory() for _ in range(3)]
    decisions = schedule(build_snapshot().cluster)
    assert {d.job_id for d in decisions} == {str(j.pk) for j in jobs}
    cancelled = jobs[1]
    Job.objects.filter(pk=cancelled.pk).update(status=JobStatus.CANCELLED)  # after the round

    outcomes = apply_placements(decisions, tick=uuid.uuid4())

    by_job = {o.job_id: o for o in outcomes}
    assert by_job[str(cancelled.pk)].outcome == DecisionOutcome.SKIPPED
    assert "no longer queued" in by_job[str(cancelled.pk)].skip_reason
    for job in (jobs[0], jobs[2]):
        assert by_job[str(job.pk)].outcome == DecisionOutcome.APPLIED
        assert Attempt.objects.get(job=job).node == node
    assert not Attempt.objects.filter(job=cancelled).exists()
    assert GpuAssignment.objects.count() == 2  # nothing of the refused group's first try


def test_two_placements_of_one_group_on_the_same_gpu_start_one_job_and_skip_the_other():
    node = NodeFactory(gpus=1)
    first, second = JobFactory(), JobFactory()
    gpu_id = node.gpus.get().pk
    decisions = [
        Place(job_id=str(job.pk), node=node.name, gpu_ids=(gpu_id,), gpu_type="H100", reason="x")
        for job in (first, second)
    ]

    outcomes = apply_placements(decisions, tick=uuid.uuid4())

    assert [o.outcome for o in outcomes] == [DecisionOutcome.APPLIED, DecisionOutcome.SKIPPED]
    assert GpuAssignment.objects.get().attempt.job_id == first.pk
    second.refresh_from_db()
    assert second.status == JobStatus.QUEUED


def test_snapshot_reads_the_fleet_queue_and_allocations_in_a_fixed_number_of_queries(
    django_assert_max_num_queries,
):
    for _ in range(3):
        NodeFactory(gpus=4)
    for _ in range(5):
        JobFactory(org=OrgFactory())
    run_dispatch_tick()
    for _ in range(40):
        JobFactory()

    with django_assert_max_num_queries(12):
        snapshot = build_snapshot()

    assert len(snapshot.cluster.running) == 5
    assert snapshot.queue_depth == {"paid": 40}
    free = sum(1 for node in snapshot.cluster.nodes for gpu in node.gpus if gpu.free)
    assert free == 7


def test_snapshot_bounds_the_jobs_it_loads_per_user(settings):
    settings.GANTRY_POLICY = {"queue_depth_per_user": 3, "queue_window_jobs": 0}
    NodeFactory(gpus=1)
    flooder = OrgFactory()
    project = JobFactory(org=flooder).project
    for _ in range(9):
        JobFactory(org=flooder, project=project)
    other = JobFactory()

    snapshot = build_snapshot()

    loaded = [job.id for job in snapshot.cluster.queued]
    assert len(loaded) == 4  # the flooder's 3 oldest, and the other org's job
    assert str(other.pk) in loaded
    assert snapshot.queue_depth["paid"] == 11  # the gauge still counts every queued job


def test_a_job_with_a_claim_is_loaded_however_deep_in_its_queue(settings):
    settings.GANTRY_POLICY = {"queue_depth_per_user": 2, "queue_window_jobs": 0}
    node = NodeFactory(gpus=1)
    org = OrgFactory()
    project = JobFactory(org=org).project
    deep = [JobFactory(org=org, project=project) for _ in range(4)][-1]
    NodeClaim.objects.create(job=deep, node=node, kind=DecisionKind.RESERVE)

    queued = {job.id: job for job in build_snapshot().cluster.queued}

    assert len(queued) == 3
    assert queued[str(deep.pk)].claimed_node == node.name


def test_running_attempts_count_as_usage_of_their_org_at_once():
    NodeFactory(gpus=2)
    busy = JobFactory(gpu_count=2)
    run_dispatch_tick()
    start_attempt(live_attempt(busy), ran_for_s=600)
    idle = JobFactory()

    usage = build_snapshot().cluster.usage

    assert usage.by_org[str(busy.org_id)] > 1000  # ~2 GPUs x 600 s, slightly decayed
    assert usage.by_org.get(str(idle.org_id), 0.0) == 0.0


def _full_node_of_free_and_paid_work(*, preemptible: bool):
    """A 4-GPU node held by a free 2-GPU job (the would-be victim), a non-preemptible
    free 1-GPU job (so free stays above its floor) and a non-preemptible paid job."""
    node = NodeFactory(gpus=4)
    free_org = OrgFactory(tier=Tier.FREE)
    victim = JobFactory(org=free_org, gpu_count=2, preemptible=preemptible)
    JobFactory(org=free_org, preemptible=False)
    JobFactory(org=OrgFactory(tier=Tier.PAID), preemptible=False)
    assert run_dispatch_tick().placed == 3
    for attempt in Attempt.objects.all():
        start_attempt(attempt, ran_for_s=300)
    return node, victim


def test_an_enterprise_job_preempts_a_free_one_then_takes_its_gpus_once_they_are_left():
    node, victim = _full_node_of_free_and_paid_work(preemptible=True)
    victim_attempt = live_attempt(victim)
    urgent = queued_since(120, org=OrgFactory(tier=Tier.ENTERPRISE), gpu_count=2)

    result = run_dispatch_tick()

    assert result.preempted == 1 and result.placed == 0
    victim.refresh_from_db()
    assert victim.status == JobStatus.PREEMPTING
    event = JobEvent.objects.get(job=victim, to_status=JobStatus.PREEMPTING)
    assert str(urgent.pk) in event.reason
    audit = DispatchDecision.objects.get(kind=DecisionKind.PREEMPT)
    assert audit.job_id == urgent.pk and audit.victims == [victim.pk]
    assert NodeClaim.objects.get(job=urgent).node == node
    assert Job.objects.filter(status=JobStatus.PREEMPTING).count() == 1  # the fewest victims
    # The victim still holds its GPUs: nothing is placed until it has left them.
    assert run_dispatch_tick().placed == 0
    assert Job.objects.get(pk=urgent.pk).status == JobStatus.QUEUED

    # The runner checkpoints, finishes the attempt, releases the GPUs and requeues.
    assert requeue_attempt(
        attempt_id=victim_attempt.pk,
        reason="preempted; checkpoint saved",
        actor="worker:test",
        exit_class="preempted",
        only_from=[JobStatus.PREEMPTING],
        job_changes={"preemption_count": F("preemption_count") + 1},
    )
    victim.refresh_from_db()
    assert victim.status == JobStatus.QUEUED and victim.preemption_count == 1

    run_dispatch_tick()

    urgent.refresh_from_db()
    assert urgent.status == JobStatus.SCHEDULED
    assert live_attempt(urgent).node == node
    assert not NodeClaim.objects.exists()
    assert Job.objects.get(pk=victim.pk).status == JobStatus.QUEUED


def test_a_preempted_tenant_reads_why_without_the_other_job_its_org_or_scores():
    _, victim = _full_node_of_free_and_paid_work(preemptible=True)
    urgent_org = OrgFactory(tier=Tier.ENTERPRISE)
    urgent = queued_since(120, org=urgent_org, gpu_count=2)
    assert run_dispatch_tick().preempted == 1

    as_tenant = client_with(org_key(victim.org)).get(f"/v1/jobs/{victim.pk}/events").json()
    as_operator = client_with(operator_key()).get(f"/v1/jobs/{victim.pk}/events").json()

    tenant_reasons = " | ".join(e["reason"] for e in as_tenant["results"])
    for secret in (str(urgent.pk), str(urgent.pk)[:8], str(urgent_org.pk)[:8], "fair share"):
        assert secret not in tenant_reasons, tenant_reasons
    assert "preempted for a higher-priority job" in tenant_reasons
    assert "placed on" in tenant_reasons  # its own node and GPUs are its to know
    operator_reasons = " | ".join(e["reason"] for e in as_operator["results"])
    assert str(urgent.pk) in operator_reasons  # the whole story stays for operators


def test_a_non_preemptible_job_is_never_stopped():
    _node, safe = _full_node_of_free_and_paid_work(preemptible=False)
    queued_since(600, org=OrgFactory(tier=Tier.ENTERPRISE), gpu_count=2)

    result = run_dispatch_tick()

    assert result.preempted == 0
    assert not Job.objects.filter(status=JobStatus.PREEMPTING).exists()
    assert Job.objects.get(pk=safe.pk).status == JobStatus.RUNNING


def test_requeue_twice_changes_nothing_the_second_time():
    NodeFactory(gpus=1)
    job = JobFactory()
    run_dispatch_tick()
    attempt = start_attempt(live_attempt(job), ran_for_s=30)

    first = requeue_attempt(attempt_id=attempt.pk, reason="lost", actor="test")
    second = requeue_attempt(attempt_id=attempt.pk, reason="lost", actor="test")

    assert (first, second) == (True, False)
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.QUEUED).count() == 1
    assert not GpuAssignment.objects.filter(released_at__isnull=True).exists()
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.FINISHED


def test_removed_nodes_are_not_in_the_snapshot():
    node = NodeFactory(gpus=2)
    JobFactory()
    run_dispatch_tick()

    Node.objects.filter(pk=node.pk).update(state=NodeState.DOWN)
    assert build_snapshot().cluster.nodes == []


def _four_gpus_three_held_by_free_jobs():
    """A 4-GPU node where three free jobs of one org started 10 s ago: (node, their org)."""
    node = NodeFactory(gpus=4)
    free_org = OrgFactory(tier=Tier.FREE)
    for _ in range(3):
        JobFactory(org=free_org, max_runtime_s=600)
    run_dispatch_tick()
    for attempt in Attempt.objects.all():
        start_attempt(attempt, ran_for_s=10)
    return node, free_org


def test_a_blocked_multi_gpu_job_reserves_a_node_that_only_short_jobs_backfill(settings):
    settings.GANTRY_POLICY = {"reserved_node_share": 1.0}  # the one node may drain
    node, _ = _four_gpus_three_held_by_free_jobs()
    big = queued_since(5, gpu_count=4)  # paid, not yet waiting long enough to preempt

    result = run_dispatch_tick()

    assert result.count(DecisionKind.RESERVE) == 1
    claim = NodeClaim.objects.get(job=big)
    assert (claim.node, claim.kind) == (node, DecisionKind.RESERVE)
    long_job = JobFactory(org=OrgFactory(tier=Tier.ENTERPRISE), max_runtime_s=3600)
    short_job = JobFactory(org=OrgFactory(tier=Tier.ENTERPRISE), max_runtime_s=60)

    run_dispatch_tick()

    assert Job.objects.get(pk=long_job.pk).status == JobStatus.QUEUED  # would delay `big`
    assert Job.objects.get(pk=short_job.pk).status == JobStatus.SCHEDULED  # done before
    reserve_rows = DispatchDecision.objects.filter(kind=DecisionKind.RESERVE, job=big)
    assert reserve_rows.count() == 1  # a repeated reservation is not written again
    assert NodeClaim.objects.get(job=big).node == node


def test_a_retry_is_placed_away_from_the_node_its_attempt_crashed_on():
    crashed_on = NodeFactory(gpus=2)  # the best fit for one GPU
    elsewhere = NodeFactory(gpus=8)
    job = JobFactory(gpu_count=1)
    run_dispatch_tick()
    attempt = live_attempt(job)
    assert attempt.node == crashed_on

    assert requeue_attempt(
        attempt_id=attempt.pk, reason="the generator crashed", actor="test", exit_class="crashed"
    )
    run_dispatch_tick()

    retry = live_attempt(job)
    assert retry.number == 2
    assert retry.node == elsewhere


def test_preemption_stops_the_job_that_checkpointed_last_losing_the_least_work():
    paid_org = OrgFactory(tier=Tier.PAID)
    NodeFactory(gpus=2)
    NodeFactory(gpus=2)
    unsaved = JobFactory(org=paid_org, gpu_count=2, max_runtime_s=7200)
    saved = JobFactory(org=paid_org, gpu_count=2, max_runtime_s=7200)
    assert run_dispatch_tick().placed == 2
    # Without checkpoints the younger run would lose less: it would be the victim.
    start_attempt(live_attempt(unsaved), ran_for_s=400)
    start_attempt(live_attempt(saved), ran_for_s=600)
    attempt = live_attempt(saved)
    assert attempts.heartbeat(attempt, gpu_ms=1, charged=0, seq=1, checkpoint="step-90")
    attempt.refresh_from_db()
    assert attempt.checkpointed_at is not None
    queued_since(120, org=OrgFactory(tier=Tier.ENTERPRISE), gpu_count=2)

    assert run_dispatch_tick().preempted == 1

    assert Job.objects.get(pk=saved.pk).status == JobStatus.PREEMPTING
    assert Job.objects.get(pk=unsaved.pk).status == JobStatus.RUNNING


def test_a_paid_jobs_drain_gives_way_to_an_enterprise_job_that_preempts_there(settings):
    settings.GANTRY_POLICY = {
        "reserved_node_share": 1.0,  # the one node may drain
        "tier_floors": {"enterprise": 0, "paid": 0, "free": 0},  # free work may be taken
    }
    node, free_org = _four_gpus_three_held_by_free_jobs()
    big = queued_since(5, gpu_count=4)  # paid, under its preemption threshold: it drains
    run_dispatch_tick()
    assert NodeClaim.objects.get(job=big).kind == DecisionKind.RESERVE
    urgent = queued_since(30, org=OrgFactory(tier=Tier.ENTERPRISE), gpu_count=4)

    result = run_dispatch_tick()

    assert result.preempted == 1
    claim = NodeClaim.objects.get(job=urgent)
    assert (claim.node, claim.kind) == (node, DecisionKind.PREEMPT)
    assert Job.objects.filter(org=free_org, status=JobStatus.PREEMPTING).count() == 3
    assert Job.objects.get(pk=big.pk).status == JobStatus.QUEUED
