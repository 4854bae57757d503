"""Decayed GPU usage for fair share, and the dispatcher's Prometheus series."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from apps.accounts.models import Tier
from apps.jobs.models import Attempt, AttemptState
from apps.scheduler.models import RecordedAttemptUsage, UsageAccount, UsageScope
from apps.scheduler.policy import PolicyConfig
from apps.scheduler.services.dispatch import run_dispatch_tick
from apps.scheduler.services.recovery import requeue_attempt
from apps.scheduler.services.snapshot import build_snapshot
from apps.scheduler.services.usage import (
    add_gpu_usage,
    fold_ended_attempts,
    record_attempt_usage,
    spread_factor,
)
from tests.factories import OrgFactory, UserFactory
from tests.scheduler.factories import JobFactory, NodeFactory, live_attempt, start_attempt

pytestmark = pytest.mark.django_db


def test_recorded_usage_accrues_per_tier_org_and_user():
    org = OrgFactory(tier=Tier.PAID)
    user = UserFactory(org=org)

    add_gpu_usage([(org.tier, org.pk, user.pk, 100)])
    add_gpu_usage([(org.tier, org.pk, user.pk, 50)])

    usage = build_snapshot().cluster.usage
    assert usage.by_org[str(org.pk)] == pytest.approx(150, rel=1e-3)
    assert usage.by_user[(str(org.pk), str(user.pk))] == pytest.approx(150, rel=1e-3)
    assert usage.by_tier["paid"] == pytest.approx(150, rel=1e-3)


def test_old_usage_has_decayed_by_its_half_lives(settings):
    settings.GANTRY_USAGE_HALF_LIFE_S = 600
    org = OrgFactory()
    add_gpu_usage([(org.tier, org.pk, None, 1000)])
    UsageAccount.objects.update(as_of=UsageAccount.objects.first().as_of - timedelta(hours=1))

    usage = build_snapshot().cluster.usage

    assert usage.by_org[str(org.pk)] == pytest.approx(1000 / 64, rel=1e-3)  # six half-lives


def test_a_finished_attempt_is_recorded_exactly_once_at_its_decayed_worth(settings):
    settings.GANTRY_USAGE_HALF_LIFE_S = 1800
    NodeFactory(gpus=2)
    job = JobFactory(gpu_count=2)
    run_dispatch_tick()
    attempt = start_attempt(live_attempt(job), ran_for_s=900)
    Attempt.objects.filter(pk=attempt.pk).update(gpu_ms=2 * 900 * 1000)
    requeue_attempt(attempt_id=attempt.pk, reason="lost", actor="test")

    again = record_attempt_usage(attempt_id=attempt.pk)  # the on_commit call did not run

    assert again == pytest.approx(1800)
    assert record_attempt_usage(attempt_id=attempt.pk) is None
    assert RecordedAttemptUsage.objects.count() == 1
    org = UsageAccount.objects.get(scope=UsageScope.ORG, key=str(job.org_id))
    assert org.value == pytest.approx(1800 * spread_factor(900, 1800), rel=1e-3)


def test_a_tick_folds_many_ended_attempts_in_as_many_statements_as_one_each_once(settings):
    settings.GANTRY_USAGE_HALF_LIFE_S = 1800

    def fold(count: int) -> tuple[int, list]:
        NodeFactory(gpus=count)
        org = OrgFactory(tier=Tier.PAID)
        users = [UserFactory(org=org) for _ in range(2)]
        jobs = [JobFactory(org=org, user=users[n % 2]) for n in range(count)]
        run_dispatch_tick()
        for job in jobs:
            attempt = start_attempt(live_attempt(job), ran_for_s=600)
            Attempt.objects.filter(pk=attempt.pk).update(gpu_ms=600 * 1000)
            Attempt.objects.filter(pk=attempt.pk).update(
                state=AttemptState.FINISHED, finished_at=Now()
            )
        with CaptureQueriesContext(connection) as queries:
            assert fold_ended_attempts() == count
        assert fold_ended_attempts() == 0  # each attempt once
        return len(queries), [org, *users]

    one, _ = fold(1)
    many, (org, *users) = fold(12)

    assert many == one
    worth = 600 * spread_factor(600, 1800)
    value = dict(UsageAccount.objects.values_list("key", "value"))
    assert value[str(org.pk)] == pytest.approx(12 * worth, rel=1e-3)
    for user in users:
        assert value[f"{org.pk}/{user.pk}"] == pytest.approx(6 * worth, rel=1e-3)


def test_an_attempt_that_never_started_records_nothing():
    NodeFactory()
    job = JobFactory()
    run_dispatch_tick()

    assert record_attempt_usage(attempt_id=live_attempt(job).pk) is None
    assert not UsageAccount.objects.exists()


def _four_attempts_ran_20_40_60_and_80_percent_of_their_max_runtime():
    """Four jobs of one paid org; returns their tier."""
    NodeFactory(gpus=4)
    org = OrgFactory(tier=Tier.PAID)
    jobs = [JobFactory(max_runtime_s=100, org=org) for _ in range(4)]
    run_dispatch_tick()
    for job, ran in zip(jobs, (20, 40, 60, 80), strict=True):
        attempt = start_attempt(live_attempt(job), ran_for_s=ran)
        Attempt.objects.filter(pk=attempt.pk).update(
            finished_at=attempt.started_at + timedelta(seconds=ran), exit_class="succeeded"
        )
    return jobs[0].tier


def test_the_snapshot_reads_each_tiers_median_and_late_runtime_ratio_of_its_recent_attempts():
    # Start estimates expect the median (50 %), the preemption hold-back the 75th
    # percentile, once as many of the tier's attempts finished as the policy asks for;
    # the other tiers, with none, estimate from paid's attempts and hold preemptions
    # back for their jobs' whole max runtime.
    assert _four_attempts_ran_20_40_60_and_80_percent_of_their_max_runtime() == Tier.PAID

    cluster = build_snapshot(config=PolicyConfig(runtime_ratio_min_samples=4)).cluster

    assert cluster.typical_ratio(Tier.PAID) == pytest.approx(0.5, abs=0.01)
    assert cluster.late_ratio(Tier.PAID) == pytest.approx(0.65, abs=0.01)
    assert cluster.runtime_ratios_by_tier[Tier.FREE] == pytest.approx((0.5, 1.0), abs=0.01)
    assert cluster.runtime_ratios_by_tier[Tier.ENTERPRISE] == pytest.approx((0.5, 1.0), abs=0.01)


def test_too_few_finished_attempts_hold_preemption_back_for_the_whole_max_runtime():
    # Four finished: enough for start estimates (three), not for the hold-back (five
    # here), which expects running jobs to run their whole max runtime.
    _four_attempts_ran_20_40_60_and_80_percent_of_their_max_runtime()

    cluster = build_snapshot(config=PolicyConfig(runtime_ratio_min_samples=5)).cluster

    assert cluster.runtime_ratios_by_tier[Tier.PAID] == (pytest.approx(0.5, abs=0.01), 1.0)
    assert cluster.runtime_ratios_by_tier[Tier.FREE] == (pytest.approx(0.5, abs=0.01), 1.0)


def _sample(name, labels=None):
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_a_tick_reports_its_duration_decisions_and_queue_depth_per_tier():
    NodeFactory(gpus=1)
    JobFactory()
    for _ in range(3):
        JobFactory(org=OrgFactory(tier=Tier.FREE))
    ticks = _sample("gantry_dispatch_tick_seconds_count")
    placed = _sample("gantry_dispatch_decisions_total", {"kind": "place", "outcome": "applied"})

    run_dispatch_tick()

    assert _sample("gantry_dispatch_tick_seconds_count") == ticks + 1
    assert (
        _sample("gantry_dispatch_decisions_total", {"kind": "place", "outcome": "applied"})
        == placed + 1
    )
    assert _sample("gantry_queue_depth", {"tier": "free"}) == 3
    assert _sample("gantry_queue_depth", {"tier": "paid"}) == 0
    assert _sample("gantry_queue_depth", {"tier": "enterprise"}) == 0
