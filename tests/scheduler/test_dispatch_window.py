"""The dispatcher reads the policy's queue window from PostgreSQL: each user's first jobs
and, per (tier, org), the backlog of the rest."""

import gc
import sys
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from apps.accounts.models import Tier
from apps.jobs.models import Job, JobStatus
from apps.scheduler.models import DecisionKind, NodeClaim
from apps.scheduler.policy import PolicyConfig, QueueBacklog, queue_window, window_depth
from apps.scheduler.services import snapshot as snapshot_module
from apps.scheduler.services.dispatch import run_dispatch_tick
from apps.scheduler.services.snapshot import build_snapshot
from tests.factories import OrgFactory, ProjectFactory, UserFactory
from tests.scheduler.factories import JobFactory, NodeFactory, queued_since

pytestmark = pytest.mark.django_db


@pytest.fixture
def depth_2(settings):
    settings.GANTRY_POLICY = {"queue_depth_per_user": 2, "queue_window_jobs": 0}


def _jobs_of(user, count, *, gpus=1, waited_from=1000.0):
    """`count` queued jobs of `user`, oldest first, a second apart."""
    project = ProjectFactory(org=user.org)
    return [
        queued_since(waited_from - i, org=user.org, project=project, user=user, gpu_count=gpus)
        for i in range(count)
    ]


def test_the_snapshot_lists_each_users_first_jobs_and_the_backlog_of_the_rest(depth_2):
    paid, free = OrgFactory(), OrgFactory(tier=Tier.FREE)
    heavy, light, loner = UserFactory(org=paid), UserFactory(org=paid), UserFactory(org=free)
    heavy_jobs = _jobs_of(heavy, 5, gpus=2)
    light_jobs = _jobs_of(light, 1)
    loner_jobs = _jobs_of(loner, 3)
    backing_off = queued_since(2000.0, org=paid, user=heavy, gpu_count=8)
    Job.objects.filter(pk=backing_off.pk).update(not_before=timezone.now() + timedelta(hours=1))

    snapshot = build_snapshot()

    listed = [job.id for job in snapshot.cluster.queued]
    expected = heavy_jobs[:2] + light_jobs + loner_jobs[:2]
    assert sorted(listed) == sorted(str(job.pk) for job in expected)
    assert listed == [str(job.pk) for job in sorted(expected, key=lambda j: (j.queued_at, j.pk))]
    assert snapshot.cluster.backlog == {
        # not the job backing off; GPU-seconds at the factory's max runtime (600 s)
        ("paid", str(paid.pk)): QueueBacklog(jobs=3, gpus=6, gpu_seconds=3 * 2 * 600.0),
        ("free", str(free.pk)): QueueBacklog(jobs=1, gpus=1, gpu_seconds=600.0),
    }
    assert snapshot.queued_loaded == 5
    assert snapshot.queue_depth == {"paid": 7, "free": 3}  # the gauge counts every job


def test_the_database_window_is_the_policys_window(settings):
    settings.GANTRY_POLICY = {"queue_depth_per_user": 2, "queue_window_jobs": 12}
    org = OrgFactory()
    users = [UserFactory(org=org) for _ in range(3)]
    for n, user in enumerate(users):
        _jobs_of(user, 3 + 4 * n, gpus=1 + n)
    _jobs_of(UserFactory(org=OrgFactory(tier=Tier.ENTERPRISE)), 2)

    read = build_snapshot().cluster
    # The whole queue, read without a window, cut by the policy's own rule.
    whole = build_snapshot(config=PolicyConfig(queue_depth_per_user=10_000)).cluster.queued
    window = queue_window(whole, read.config)

    assert window_depth([3, 7, 11, 2], read.config) == 3
    assert len(whole) == 3 + 7 + 11 + 2 and len(read.queued) == 3 + 3 + 3 + 2
    assert [job.id for job in read.queued] == [job.id for job in window.listed]
    assert read.backlog == window.backlog


def test_a_preempted_job_keeps_its_place_in_its_users_window(settings):
    settings.GANTRY_POLICY = {"queue_depth_per_user": 1, "queue_window_jobs": 0}
    user = UserFactory(org=OrgFactory())
    waiting = queued_since(100.0, org=user.org, user=user)
    preempted = queued_since(500.0, org=user.org, user=user)  # submitted first, ...
    Job.objects.filter(pk=preempted.pk).update(
        preemption_count=1, queued_at=timezone.now() - timedelta(seconds=10)
    )  # ... re-queued after it was preempted

    [listed] = build_snapshot().cluster.queued

    assert listed.id == str(preempted.pk)
    assert str(waiting.pk) != listed.id


def test_jobs_beyond_the_depth_start_once_the_earlier_ones_have(depth_2):
    NodeFactory(gpus=4)
    user = UserFactory(org=OrgFactory())
    jobs = _jobs_of(user, 4)

    first = run_dispatch_tick()
    second = run_dispatch_tick()

    assert (first.placed, first.queued_loaded) == (2, 2)  # 4 GPUs free, 2 jobs in view
    assert (second.placed, second.queued_loaded) == (2, 2)
    statuses = Job.objects.filter(pk__in=[job.pk for job in jobs]).values_list("status")
    assert {status for (status,) in statuses} == {JobStatus.SCHEDULED}


def test_few_users_with_queued_jobs_widen_the_window(settings):
    settings.GANTRY_POLICY = {"queue_depth_per_user": 1, "queue_window_jobs": 4}
    user = UserFactory(org=OrgFactory())
    _jobs_of(user, 6)

    snapshot = build_snapshot()

    assert len(snapshot.cluster.queued) == 4
    assert snapshot.cluster.backlog == {
        ("paid", str(user.org_id)): QueueBacklog(jobs=2, gpus=2, gpu_seconds=2 * 600.0)
    }


def test_with_more_users_than_the_cap_the_database_lists_the_users_the_policy_would(settings):
    # 100,000 free users with one job each would make a tick read them all; the cap
    # keeps a tick's read bounded: a share per tier, each org's oldest user first.
    settings.GANTRY_POLICY = {
        "queue_depth_per_user": 2,
        "queue_window_jobs": 0,
        "queue_window_max_jobs": 3,
    }
    crowd = OrgFactory(tier=Tier.FREE)
    crowd_users = [UserFactory(org=crowd) for _ in range(4)]
    for n, user in enumerate(crowd_users):
        _jobs_of(user, 2, waited_from=900.0 - n)  # the crowd queued first
    loner = UserFactory(org=OrgFactory(tier=Tier.FREE))
    loner_jobs = _jobs_of(loner, 1, waited_from=100.0)
    paid_user = UserFactory(org=OrgFactory())
    paid_jobs = _jobs_of(paid_user, 3, waited_from=50.0)

    read = build_snapshot().cluster
    whole = build_snapshot(
        config=PolicyConfig(queue_depth_per_user=10_000, queue_window_max_jobs=10_000)
    ).cluster.queued
    window = queue_window(whole, read.config)

    # Six users for three places: paid's one user (one job) and two of free's five: the
    # crowd's oldest, then the loner (its org's first user) before the crowd's second.
    first_crowd_job = Job.objects.filter(user=crowd_users[0]).order_by("queued_at").first()
    assert {job.id for job in read.queued} == {
        str(first_crowd_job.pk),
        str(loner_jobs[0].pk),
        str(paid_jobs[0].pk),
    }
    assert [job.id for job in read.queued] == [job.id for job in window.listed]
    assert read.backlog == window.backlog
    assert read.backlog[("free", str(crowd.pk))] == QueueBacklog(
        jobs=7, gpus=7, gpu_seconds=7 * 600.0
    )
    assert read.backlog[("paid", str(paid_user.org_id))] == QueueBacklog(
        jobs=2, gpus=2, gpu_seconds=2 * 600.0
    )


@pytest.mark.parametrize(
    ("users_per_tier", "cap"),
    [
        ((1, 5, 9), 3),
        ((1, 5, 9), 4),
        ((1, 5, 9), 7),
        ((1, 5, 9), 12),
        ((0, 6, 6), 5),
        ((0, 6, 6), 11),
        ((2, 2, 7), 6),
        ((3, 3, 3), 8),
    ],
)
def test_the_users_the_database_lists_per_tier_are_the_policys_share(settings, users_per_tier, cap):
    # The per-tier share (max-min: the most users per tier whose sum fits the cap) is
    # computed from three per-tier counts in SQL: the same users as the policy's.
    settings.GANTRY_POLICY = {
        "queue_depth_per_user": 1,
        "queue_window_jobs": 0,
        "queue_window_max_jobs": cap,
    }
    for tier, users in zip((Tier.ENTERPRISE, Tier.PAID, Tier.FREE), users_per_tier, strict=True):
        orgs = [OrgFactory(tier=tier), OrgFactory(tier=tier)]
        for n in range(users):
            _jobs_of(UserFactory(org=orgs[n % 2]), 1, waited_from=900.0 - 7 * n)

    read = build_snapshot().cluster
    whole = build_snapshot(
        config=PolicyConfig(queue_depth_per_user=10_000, queue_window_max_jobs=10_000)
    ).cluster.queued

    assert len(read.queued) <= cap
    assert [job.id for job in read.queued] == [
        job.id for job in queue_window(whole, read.config).listed
    ]


# A tier's users: per org, per user, how many jobs it queued and when its oldest one was
# (few distinct times, so heads tie and the order falls to org and user).
_TIER_SHAPES = st.lists(  # orgs
    st.lists(
        st.tuples(st.integers(1, 2), st.sampled_from((100, 200, 300))), min_size=1, max_size=4
    ),
    max_size=4,
)


@given(shape=st.tuples(_TIER_SHAPES, _TIER_SHAPES, _TIER_SHAPES), cap=st.integers(3, 30))
@hypothesis_settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_whatever_the_tiers_orgs_users_and_cap_the_database_lists_the_policys_users(
    settings, shape, cap
):
    # The cut is computed in SQL by each head's rank within its org: whole ranks first,
    # then the oldest heads of the rank that fits in part.
    settings.GANTRY_POLICY = {
        "queue_depth_per_user": 1,
        "queue_window_jobs": 0,
        "queue_window_max_jobs": cap,
    }
    with transaction.atomic():  # each example on its own queue
        _queue_tiers(shape)
        read = build_snapshot().cluster
        whole = build_snapshot(
            config=PolicyConfig(queue_depth_per_user=10_000, queue_window_max_jobs=10_000)
        ).cluster.queued
        transaction.set_rollback(True)

    assert [job.id for job in read.queued] == [
        job.id for job in queue_window(whole, read.config).listed
    ]


def _queue_tiers(shape):
    now = timezone.now()
    for tier, orgs in zip((Tier.ENTERPRISE, Tier.PAID, Tier.FREE), shape, strict=True):
        for users in orgs:
            org = OrgFactory(tier=tier)
            project = ProjectFactory(org=org)
            for jobs, oldest in users:
                user = UserFactory(org=org)
                for n in range(jobs):
                    at = now - timedelta(seconds=oldest - 10 * n)
                    JobFactory(org=org, project=project, user=user, queued_at=at)


def test_a_claimed_job_is_listed_although_the_cap_leaves_its_user_out(settings):
    settings.GANTRY_POLICY = {
        "queue_depth_per_user": 1,
        "queue_window_jobs": 0,
        "queue_window_max_jobs": 3,
    }
    org = OrgFactory()
    for n in range(3):
        _jobs_of(UserFactory(org=org), 1, waited_from=900.0 - n)
    deep = _jobs_of(UserFactory(org=org), 2, waited_from=100.0)[1]  # its user is left out
    NodeClaim.objects.create(job=deep, node=NodeFactory(), kind=DecisionKind.RESERVE)

    listed = {job.id: job for job in build_snapshot().cluster.queued}

    assert len(listed) == 4 and listed[str(deep.pk)].claimed_node is not None


def test_the_snapshot_reads_the_weights_of_the_orgs_it_lists_other_than_1(depth_2):
    heavy, plain = OrgFactory(weight=2.5), OrgFactory()
    _jobs_of(UserFactory(org=heavy), 1)
    _jobs_of(UserFactory(org=plain), 1)
    OrgFactory(weight=4.0)  # queues nothing

    weights = build_snapshot().cluster.org_weights

    assert weights == {str(heavy.pk): 2.5}  # a missing org weighs 1 to the policy


def test_reading_a_snapshot_runs_no_pass_of_the_garbage_collector(depth_2):
    # Each pass rescans every long-lived object of the dispatcher's process: on 100,000
    # queued jobs two full passes took a tenth of the read (bench/dispatch.py).
    for n in range(3):
        _jobs_of(UserFactory(org=OrgFactory()), 20, waited_from=1000.0 - n)
    passes = []  # the reading functions that a pass interrupted

    def count(phase, info):
        frame = sys._getframe(1)
        while phase == "start" and frame is not None:
            if frame.f_code.co_filename == snapshot_module.__file__:
                passes.append(frame.f_code.co_name)
                return
            frame = frame.f_back

    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)  # a pass after every allocation, unless paused
    gc.callbacks.append(count)
    try:
        snapshot = build_snapshot()
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*thresholds)

    assert snapshot.queued_loaded == 6
    assert passes == []
    assert gc.isenabled()
