"""Settlement: capture what was used, refund the rest to the exact source buckets, once."""

import pytest
from django.db.models import Sum
from django.db.models.functions import Now

from apps.ledger import services
from apps.ledger.models import Bucket, BucketKind, Entry, Hold, HoldState
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db


def moved(hold, kind, account):
    return (
        Entry.objects.filter(hold=hold, kind=kind, account=account).aggregate(s=Sum("amount"))["s"]
        or 0
    )


def test_preempted_at_60_percent_refunds_40_percent_to_source_buckets(assert_ledger_consistent):
    org = OrgFactory()
    promo = BucketFactory(org=org, kind=BucketKind.PROMO, granted=4 * CREDIT)
    paid = BucketFactory(org=org, kind=BucketKind.PAID, granted=20 * CREDIT)
    hold = HoldFactory(org=org, amount=10 * CREDIT)  # 4 from promo, 6 from paid

    services.meter(hold, cumulative_usage=3 * CREDIT, seq=1, attempt_key="a1")
    result = services.settle(hold, reason="preempted", final_usage=6 * CREDIT, attempt_key="a1")

    assert (result.captured, result.refunded, result.state) == (6 * CREDIT, 4 * CREDIT, "settled")
    promo.refresh_from_db()
    paid.refresh_from_db()
    # Promo burns first: it paid 4 of the 6 used; paid gets back 4 of its 6 held.
    assert (promo.consumed, promo.held, promo.remaining) == (4 * CREDIT, 0, 0)
    assert (paid.consumed, paid.held, paid.remaining) == (2 * CREDIT, 0, 18 * CREDIT)
    # The entries tell the whole story, leg by leg.
    assert moved(hold, "hold", "held") == 10 * CREDIT
    assert moved(hold, "capture", "captured") == 6 * CREDIT
    assert moved(hold, "settle", "consumed") == 6 * CREDIT
    assert moved(hold, "refund", "available") == 4 * CREDIT
    refunds = Entry.objects.filter(hold=hold, kind="refund", account="available")
    assert {(e.bucket_id, e.amount) for e in refunds} == {(paid.pk, 4 * CREDIT)}
    assert [e.kind for e in Entry.objects.filter(hold=hold, amount__gt=0)] == [
        "hold",
        "hold",
        "capture",
        "capture",
        "capture",
        "settle",
        "settle",
        "refund",
    ]
    assert_ledger_consistent()


def test_settle_twice_moves_money_once_and_replays_the_first_result(assert_ledger_consistent):
    org = OrgFactory()
    BucketFactory(org=org, granted=10 * CREDIT)
    hold = HoldFactory(org=org, amount=5 * CREDIT)
    first = services.settle(hold, reason="done", final_usage=2 * CREDIT)
    entries = Entry.objects.count()
    again = services.settle(hold, reason="done again", final_usage=4 * CREDIT)
    assert again.replayed and not first.replayed
    assert (again.captured, again.refunded, again.reason) == (2 * CREDIT, 3 * CREDIT, "done")
    assert Entry.objects.count() == entries
    assert_ledger_consistent()


def test_release_of_a_job_that_never_ran_refunds_everything(assert_ledger_consistent):
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=10 * CREDIT)
    hold = services.release(HoldFactory(org=org, amount=7 * CREDIT), reason="cancelled")
    bucket.refresh_from_db()
    assert (hold.state, hold.captured, hold.refunded) == (HoldState.RELEASED, 0, 7 * CREDIT)
    assert (bucket.remaining, bucket.held, bucket.consumed) == (10 * CREDIT, 0, 0)
    assert moved(hold, "release", "available") == 7 * CREDIT
    assert_ledger_consistent()


def test_refund_to_a_bucket_that_expired_meanwhile_is_recorded_then_expired(
    assert_ledger_consistent,
):
    org = OrgFactory()
    promo = BucketFactory(org=org, kind=BucketKind.PROMO, granted=5 * CREDIT)
    hold = HoldFactory(org=org, amount=5 * CREDIT)
    Bucket.objects.filter(pk=promo.pk).update(expires_at=Now())
    assert services.expire_buckets() == 1
    result = services.settle(hold, reason="done", final_usage=0)
    promo.refresh_from_db()
    assert result.refunded == 5 * CREDIT
    assert (promo.remaining, promo.expired, promo.held) == (0, 5 * CREDIT, 0)
    assert moved(hold, "refund", "available") == 5 * CREDIT
    assert moved(hold, "expire", "expired") == 5 * CREDIT
    with pytest.raises(Exception, match="Not enough credit"):
        services.reserve(org=org, amount=1, idempotency_key="after-expiry")
    assert_ledger_consistent()


def test_a_finish_call_that_never_comes_is_recovered_by_the_expiry_task_once_not_twice(
    assert_ledger_consistent,
):
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=10 * CREDIT)
    hold = HoldFactory(org=org, amount=8 * CREDIT)
    services.meter(hold, cumulative_usage=3 * CREDIT, seq=1)
    Hold.objects.filter(pk=hold.pk).update(expires_at=Now())

    assert services.expire_stale_holds() == 1
    assert services.expire_stale_holds() == 0
    hold.refresh_from_db()
    bucket.refresh_from_db()
    assert (hold.state, hold.captured, hold.refunded) == (HoldState.EXPIRED, 3 * CREDIT, 5 * CREDIT)
    assert (bucket.consumed, bucket.held, bucket.remaining) == (3 * CREDIT, 0, 7 * CREDIT)
    assert "without a settle" in hold.reason
    # The job's own settle arriving late changes nothing.
    late = services.settle(hold, reason="finished late", final_usage=8 * CREDIT)
    assert late.replayed and late.captured == 3 * CREDIT
    assert Entry.objects.filter(hold=hold, kind="refund").count() == 2  # both legs, once
    assert_ledger_consistent()
