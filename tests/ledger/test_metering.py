"""Metering: cumulative, idempotent usage reports captured in spend order."""

import time
from datetime import timedelta

import pytest
from django.db.models.functions import Now

from apps.core.clock import db_now
from apps.core.errors import GantryError
from apps.ledger import services
from apps.ledger.allocation import share_before
from apps.ledger.models import Bucket, Entry, Hold, HoldAllocation, UsageMark
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def hold():
    org = OrgFactory()
    BucketFactory(org=org, granted=100 * CREDIT)
    return HoldFactory(org=org, amount=10 * CREDIT)


def captures(hold) -> list:
    entries = Entry.objects.filter(hold=hold, kind="capture", account="captured").order_by("id")
    return [(e.bucket_id, e.amount) for e in entries]


def test_duplicate_and_reordered_meter_reports_change_nothing(hold, assert_ledger_consistent):
    assert services.meter(hold, cumulative_usage=2 * CREDIT, seq=2).applied
    entries = Entry.objects.count()
    duplicate = services.meter(hold, cumulative_usage=2 * CREDIT, seq=2)
    older = services.meter(hold, cumulative_usage=1 * CREDIT, seq=1)
    older_but_larger = services.meter(hold, cumulative_usage=3 * CREDIT, seq=1)
    newer_but_smaller = services.meter(hold, cumulative_usage=CREDIT, seq=3)
    assert not any(r.applied for r in (duplicate, older, older_but_larger, newer_but_smaller))
    assert Entry.objects.count() == entries
    assert newer_but_smaller.captured == 2 * CREDIT
    assert services.meter(hold, cumulative_usage=5 * CREDIT, seq=4).captured == 5 * CREDIT
    assert UsageMark.objects.get(hold=hold).cumulative == 5 * CREDIT
    assert_ledger_consistent()


def test_usage_of_several_attempts_adds_up_each_at_its_own_maximum(hold, assert_ledger_consistent):
    services.meter(hold, cumulative_usage=3 * CREDIT, seq=5, attempt_key="attempt-1")
    services.meter(hold, cumulative_usage=CREDIT, seq=1, attempt_key="attempt-2")
    # attempt-2's seq numbering is its own: seq 2 after attempt-1's seq 5 still applies.
    result = services.meter(hold, cumulative_usage=2 * CREDIT, seq=2, attempt_key="attempt-2")
    assert (result.usage, result.captured) == (5 * CREDIT, 5 * CREDIT)
    assert_ledger_consistent()


def test_usage_beyond_the_hold_is_capped_and_reported_as_overrun(hold, assert_ledger_consistent):
    result = services.meter(hold, cumulative_usage=12 * CREDIT, seq=1)
    assert (result.captured, result.overrun, result.headroom) == (10 * CREDIT, 2 * CREDIT, 0)
    assert result.would_run_out
    settled = services.settle(hold, reason="done")
    assert (settled.captured, settled.refunded, settled.overrun) == (10 * CREDIT, 0, 2 * CREDIT)
    assert_ledger_consistent()


def test_a_hold_close_to_its_amount_warns_so_the_caller_can_extend(hold, settings):
    settings.GANTRY_LEDGER_LOW_HEADROOM_FRACTION = 0.2
    assert not services.meter(hold, cumulative_usage=7 * CREDIT, seq=1).would_run_out
    warned = services.meter(hold, cumulative_usage=8 * CREDIT + 1, seq=2)
    assert warned.would_run_out and warned.overrun == 0
    assert warned.headroom == 2 * CREDIT - 1


def test_usage_that_found_no_room_is_captured_once_the_hold_is_extended(
    hold, assert_ledger_consistent
):
    services.meter(hold, cumulative_usage=12 * CREDIT, seq=1)
    services.extend(hold, amount=5 * CREDIT)
    result = services.meter(hold, cumulative_usage=13 * CREDIT, seq=2)
    assert (result.captured, result.overrun, result.would_run_out) == (13 * CREDIT, 0, False)
    assert_ledger_consistent()


def test_metering_a_closed_hold_changes_nothing(hold):
    services.settle(hold, reason="done", final_usage=CREDIT)
    late = services.meter(hold, cumulative_usage=5 * CREDIT, seq=9)
    assert (late.applied, late.state, late.captured, late.would_run_out) == (
        False,
        "settled",
        CREDIT,
        False,
    )
    assert Hold.objects.get(pk=hold.pk).usage == CREDIT


@pytest.mark.parametrize(
    ("report", "field"),
    [
        ({"cumulative_usage": -1, "seq": 1}, "cumulative_usage"),
        ({"cumulative_usage": 1.5, "seq": 1}, "cumulative_usage"),
        ({"cumulative_usage": 1, "seq": -1}, "seq"),
        ({"cumulative_usage": 1, "seq": 1, "attempt_key": "x" * 201}, "attempt_key"),
    ],
)
def test_an_invalid_report_is_refused_naming_the_field(hold, report, field):
    with pytest.raises(GantryError) as refused:
        services.meter(hold, **report)
    assert refused.value.field == field


def test_a_promo_bucket_expiring_while_a_job_runs_on_it_pays_only_for_usage_before_expiry(
    assert_ledger_consistent,
):
    org = OrgFactory()
    expiry = db_now() + timedelta(seconds=1.5)
    promo = BucketFactory(org=org, kind="promo", granted=6 * CREDIT, expires_at=expiry)
    paid = BucketFactory(org=org, kind="paid", granted=20 * CREDIT)
    hold = HoldFactory(org=org, amount=10 * CREDIT)  # 6 from the promo, 4 from paid
    time.sleep(0.3)
    before = services.meter(hold, cumulative_usage=2 * CREDIT, seq=1)
    assert not before.would_run_out and before.headroom == 8 * CREDIT
    while db_now() <= expiry:  # the job keeps running across the promo's expiry
        time.sleep(0.1)
    after = services.meter(hold, cumulative_usage=6 * CREDIT, seq=2)

    # The 4 credits used between the two reports are split at the expiry instant: the
    # promo pays only for the part that accrued before it expired, paid for the rest.
    first, second = (
        Entry.objects.filter(hold=hold, kind="capture", account="captured")
        .values_list("created_at", flat=True)
        .distinct()
        .order_by("created_at")
    )
    before_expiry = share_before(4 * CREDIT, instant=expiry, since=first, now=second)
    assert 0 < before_expiry < 4 * CREDIT
    split = dict(HoldAllocation.objects.filter(hold=hold).values_list("bucket_id", "captured"))
    assert split == {promo.pk: 2 * CREDIT + before_expiry, paid.pk: 4 * CREDIT - before_expiry}
    for entry in Entry.objects.filter(bucket=promo, kind="capture", account="captured"):
        assert entry.usage_until <= expiry
    # What is left of the promo cannot serve the job any more: only paid room counts.
    assert after.headroom == before_expiry

    services.expire_buckets()
    result = services.settle(hold, reason="done", final_usage=6 * CREDIT)
    promo.refresh_from_db()
    assert result.captured == 6 * CREDIT
    assert promo.remaining == 0 and promo.held == 0
    assert promo.consumed + promo.expired == 6 * CREDIT
    assert_ledger_consistent()


def test_usage_reported_after_a_promo_expired_is_never_drawn_from_it(assert_ledger_consistent):
    org = OrgFactory()
    promo = BucketFactory(
        org=org, kind="promo", granted=5 * CREDIT, expires_at=db_now() + timedelta(hours=1)
    )
    paid = BucketFactory(org=org, kind="paid", granted=5 * CREDIT)
    hold = HoldFactory(org=org, amount=8 * CREDIT)
    # The promo expired before the hold's first usage window began.
    Bucket.objects.filter(pk=promo.pk).update(expires_at=Now())
    Hold.objects.filter(pk=hold.pk).update(metered_at=Now() + timedelta(microseconds=1))
    result = services.meter(hold, cumulative_usage=4 * CREDIT, seq=1)
    assert captures(hold) == [(paid.pk, 3 * CREDIT)]
    assert (result.captured, result.overrun, result.headroom) == (3 * CREDIT, CREDIT, 0)
    assert_ledger_consistent()
