"""Capture cadence: live usage at once, capture entries at most once a minute per hold.

The database clock cannot be moved, so a simulated minute passes by moving the hold's
last capture (and its creation) a minute into the past.
"""

from datetime import timedelta

import pytest
from django.db.models import F
from django.db.models.functions import Coalesce

from apps.ledger import services
from apps.ledger.models import Entry, Hold
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db

MINUTE = timedelta(seconds=60)


@pytest.fixture(autouse=True)
def capture_once_a_minute(settings, capture_every_report):
    settings.GANTRY_LEDGER_CAPTURE_INTERVAL_S = 60.0


@pytest.fixture
def hold():
    org = OrgFactory()
    BucketFactory(org=org, granted=100 * CREDIT)
    return HoldFactory(org=org, amount=10 * CREDIT)


def capture_txns(hold) -> int:
    return (
        Entry.objects.filter(hold=hold, kind="capture", account="captured")
        .values("txn")
        .distinct()
        .count()
    )


def a_minute_passes(hold) -> None:
    Hold.objects.filter(pk=hold.pk).update(
        metered_at=Coalesce(F("metered_at"), F("created_at")) - MINUTE,
        created_at=F("created_at") - MINUTE,
    )


def test_reports_within_a_minute_raise_live_usage_without_a_capture(hold, assert_ledger_consistent):
    for seq in range(1, 31):  # a minute of heartbeats every 2 s
        result = services.meter(hold, cumulative_usage=seq * CREDIT // 10, seq=seq)
        assert result.applied
    hold.refresh_from_db()
    assert (hold.usage, hold.captured) == (3 * CREDIT, 0)
    assert capture_txns(hold) == 0
    assert (result.headroom, result.overrun) == (7 * CREDIT, 0)
    assert_ledger_consistent()


def test_a_minute_after_the_last_capture_one_report_captures_all_that_is_new(
    hold, assert_ledger_consistent
):
    services.meter(hold, cumulative_usage=CREDIT, seq=1)
    a_minute_passes(hold)
    result = services.meter(hold, cumulative_usage=2 * CREDIT, seq=2)
    assert (result.usage, result.captured) == (2 * CREDIT, 2 * CREDIT)
    services.meter(hold, cumulative_usage=3 * CREDIT, seq=3)
    assert capture_txns(hold) == 1
    hold.refresh_from_db()
    assert (hold.usage, hold.captured) == (3 * CREDIT, 2 * CREDIT)
    assert_ledger_consistent()


def test_several_minutes_of_heartbeats_capture_once_a_minute_and_settle_exactly(
    hold, assert_ledger_consistent
):
    seq = 0
    for _minute in range(5):
        for _beat in range(30):
            seq += 1
            services.meter(hold, cumulative_usage=seq * CREDIT // 20, seq=seq)
        a_minute_passes(hold)
    assert capture_txns(hold) <= 5
    settled = services.settle(hold, reason="done", final_usage=seq * CREDIT // 20 + 7)
    assert settled.captured == 150 * CREDIT // 20 + 7
    assert settled.refunded == 10 * CREDIT - settled.captured
    assert capture_txns(hold) <= 6  # once a minute, plus the settlement's
    assert_ledger_consistent()


def test_uncaptured_live_usage_takes_headroom_and_runs_the_hold_out(hold, assert_ledger_consistent):
    result = services.meter(hold, cumulative_usage=9_500_000, seq=1)
    assert result.captured == 0
    assert (result.headroom, result.overrun) == (500_000, 0)
    assert result.would_run_out  # within 10 % of the hold's amount
    result = services.meter(hold, cumulative_usage=12 * CREDIT, seq=2)
    assert (result.headroom, result.overrun) == (0, 2 * CREDIT)
    assert_ledger_consistent()


def test_a_crash_between_captures_still_settles_at_the_live_usage(hold, assert_ledger_consistent):
    # Heartbeats raised the live usage; the worker died before any capture or a final
    # report. Settling without a final figure charges what the hold recorded.
    for seq in range(1, 11):
        services.meter(hold, cumulative_usage=seq * CREDIT // 4, seq=seq)
    settled = services.settle(hold, reason="worker lost")
    assert (settled.captured, settled.refunded) == (10 * CREDIT // 4, 30 * CREDIT // 4)
    assert capture_txns(hold) == 1
    assert_ledger_consistent()
