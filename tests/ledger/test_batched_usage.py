"""The batched heartbeat path: reports go to Redis, a periodic fold meters them in."""

import random

import pytest

from apps.ledger import services
from apps.ledger.models import Hold, UsageMark
from apps.ledger.services.usage_batch import _keys
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def holds(usage_redis):
    org = OrgFactory()
    BucketFactory(org=org, granted=10_000 * CREDIT)
    return [HoldFactory(org=org, amount=50 * CREDIT) for _ in range(20)]


def test_recording_a_heartbeat_touches_redis_only(holds, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert services.record_usage(
            hold_id=holds[0].pk, attempt_key="a", cumulative_usage=5, seq=1
        )
        assert not services.record_usage(
            hold_id=holds[0].pk, attempt_key="a", cumulative_usage=4, seq=2
        )
    assert services.pending_usage_reports() == 1


def test_folding_10k_reports_with_duplicates_meters_each_attempt_at_its_maximum(
    holds, assert_ledger_consistent
):
    rng = random.Random(7)
    expected = {}
    reports = []
    for hold in holds:
        for attempt in ("a1", "a2"):
            top = rng.randrange(1, 20) * CREDIT
            expected[(hold.pk, attempt)] = top
            steps = [*sorted(rng.sample(range(1, top), 248)), top]
            reports += [(hold.pk, attempt, cumulative, seq) for seq, cumulative in enumerate(steps)]
    reports += rng.sample(reports, 40)  # duplicated heartbeats
    rng.shuffle(reports)  # and reordered ones
    assert len(reports) == 10_000

    for hold_id, attempt, cumulative, seq in reports:
        services.record_usage(
            hold_id=hold_id, attempt_key=attempt, cumulative_usage=cumulative, seq=seq
        )
    assert services.fold_usage_reports(batch_limit=7) == len(expected)

    marks = {(m.hold_id, m.attempt_key): m.cumulative for m in UsageMark.objects.all()}
    assert marks == expected
    for hold in Hold.objects.filter(pk__in=[h.pk for h in holds]):
        usage = expected[(hold.pk, "a1")] + expected[(hold.pk, "a2")]
        assert (hold.usage, hold.captured) == (usage, min(usage, hold.amount))
    assert services.pending_usage_reports() == 0
    assert services.fold_usage_reports() == 0
    assert_ledger_consistent()


def test_after_a_redis_flushdb_the_next_cumulative_report_loses_nothing(
    holds, usage_redis, assert_ledger_consistent
):
    hold = holds[0]
    services.record_usage(hold_id=hold.pk, attempt_key="a", cumulative_usage=2 * CREDIT, seq=1)
    services.fold_usage_reports()
    services.record_usage(hold_id=hold.pk, attempt_key="a", cumulative_usage=5 * CREDIT, seq=2)
    usage_redis.flushdb()  # Redis restarted: report seq 2 is gone
    assert services.fold_usage_reports() == 0
    hold.refresh_from_db()
    assert hold.captured == 2 * CREDIT

    services.record_usage(hold_id=hold.pk, attempt_key="a", cumulative_usage=7 * CREDIT, seq=3)
    services.fold_usage_reports()
    hold.refresh_from_db()
    assert (hold.usage, hold.captured) == (7 * CREDIT, 7 * CREDIT)
    assert_ledger_consistent()


def test_a_fold_that_crashed_before_deleting_its_snapshot_never_captures_twice(
    holds, usage_redis, assert_ledger_consistent
):
    for seq, hold in enumerate(holds):
        services.record_usage(hold_id=hold.pk, attempt_key="", cumulative_usage=3 * CREDIT, seq=seq)
    pending, inflight = _keys()
    snapshot = dict(usage_redis.zrange(pending, 0, -1, withscores=True))
    services.fold_usage_reports()
    # The crash: the ledger committed, but the in-flight set was never deleted.
    usage_redis.zadd(inflight, snapshot)
    services.record_usage(hold_id=holds[0].pk, attempt_key="", cumulative_usage=4 * CREDIT, seq=99)

    assert services.fold_usage_reports() == len(holds) + 1  # the leftover, then what is new
    captured = dict(Hold.objects.filter(pk__in=[h.pk for h in holds]).values_list("pk", "captured"))
    assert captured == {h.pk: (4 if h == holds[0] else 3) * CREDIT for h in holds}
    assert not usage_redis.exists(inflight) and not usage_redis.exists(pending)
    assert_ledger_consistent()


def test_reports_for_closed_unknown_or_garbled_holds_are_dropped(holds, usage_redis):
    closed = holds[0]
    services.settle(closed, reason="done", final_usage=CREDIT)
    services.record_usage(hold_id=closed.pk, attempt_key="a", cumulative_usage=9 * CREDIT, seq=5)
    services.record_usage(
        hold_id="00000000-0000-0000-0000-000000000000", attempt_key="a", cumulative_usage=1, seq=1
    )
    pending, _ = _keys()
    usage_redis.zadd(pending, {"not-a-hold|a": 1, f"{holds[1].pk}-without-attempt": 7})
    services.fold_usage_reports()
    closed.refresh_from_db()
    assert closed.captured == CREDIT
    assert not UsageMark.objects.filter(hold=holds[1]).exists()
    assert services.pending_usage_reports() == 0
