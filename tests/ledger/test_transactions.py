"""A service call is its own transaction (two round trips), or part of the caller's."""

import pytest
from django.db import connection, transaction
from prometheus_client import REGISTRY
from psycopg.pq import TransactionStatus

from apps.core.errors import BudgetExceeded, InsufficientCredits
from apps.ledger import services
from apps.ledger.models import Bucket, BudgetAlert, Entry, Hold
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, BudgetFactory, HoldFactory

pytestmark = pytest.mark.django_db(transaction=True)


def operations(op: str, outcome: str) -> float:
    labels = {"op": op, "outcome": outcome}
    return REGISTRY.get_sample_value("gantry_ledger_operations_total", labels) or 0.0


def idle() -> bool:
    return connection.connection.info.transaction_status == TransactionStatus.IDLE


def test_a_reservation_inside_the_callers_transaction_commits_or_rolls_back_with_it(
    assert_ledger_consistent,
):
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=10 * CREDIT)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.reserve(org=org, amount=4 * CREDIT, idempotency_key="admission-1")
        raise RuntimeError("the job row could not be written")
    bucket.refresh_from_db()
    assert bucket.held == 0 and not Hold.objects.exists()

    with transaction.atomic():
        hold = services.reserve(org=org, amount=4 * CREDIT, idempotency_key="admission-1")
        assert Hold.objects.filter(pk=hold.pk).exists()  # visible inside the caller's
    bucket.refresh_from_db()
    assert bucket.held == 4 * CREDIT
    assert_ledger_consistent()


def test_a_reservation_is_counted_when_the_callers_transaction_commits_not_before():
    org = OrgFactory()
    BucketFactory(org=org, granted=10 * CREDIT)
    BudgetFactory(org=org, limit=CREDIT, mode="soft")
    ok_before = operations("reserve", "ok")
    alerts_before = REGISTRY.get_sample_value("gantry_ledger_budget_alerts_total") or 0.0

    with pytest.raises(RuntimeError), transaction.atomic():
        services.reserve(org=org, amount=2 * CREDIT, idempotency_key="rolled-back")
        raise RuntimeError("the job row could not be written")
    assert operations("reserve", "ok") == ok_before

    with transaction.atomic():
        services.reserve(org=org, amount=2 * CREDIT, idempotency_key="kept")
        assert operations("reserve", "ok") == ok_before  # not yet committed
    assert operations("reserve", "ok") == ok_before + 1
    assert REGISTRY.get_sample_value("gantry_ledger_budget_alerts_total") == alerts_before + 1


def test_a_settlement_rolled_back_with_the_callers_transaction_is_not_counted():
    org = OrgFactory()
    BucketFactory(org=org, granted=10 * CREDIT)
    hold = services.reserve(org=org, amount=2 * CREDIT, idempotency_key="job")
    settled_before = operations("settle", "ok")

    with pytest.raises(RuntimeError), transaction.atomic():
        services.settle(hold, reason="done", final_usage=CREDIT)
        raise RuntimeError("the job's transition could not be written")
    assert operations("settle", "ok") == settled_before

    services.settle(hold, reason="done", final_usage=CREDIT)
    assert operations("settle", "ok") == settled_before + 1


def test_a_hard_budget_refusal_in_its_own_transaction_leaves_nothing_behind(
    assert_ledger_consistent,
):
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=10 * CREDIT)
    BudgetFactory(org=org, limit=5 * CREDIT, mode="hard")
    services.reserve(org=org, amount=3 * CREDIT, idempotency_key="first")
    refused_before = operations("reserve", "budget_exceeded")

    with pytest.raises(BudgetExceeded, match=r"org .* would be exceeded"):
        services.reserve(org=org, amount=3 * CREDIT, idempotency_key="second")

    assert idle()
    assert operations("reserve", "budget_exceeded") == refused_before + 1
    bucket.refresh_from_db()
    assert bucket.held == 3 * CREDIT
    assert not Hold.objects.filter(idempotency_key="second").exists()
    assert Entry.objects.filter(org=org, kind="hold").count() == 2
    services.reserve(org=org, amount=2 * CREDIT, idempotency_key="third")  # still usable
    assert_ledger_consistent()


def test_a_soft_budget_alert_is_written_with_the_reservation(assert_ledger_consistent):
    org = OrgFactory()
    BucketFactory(org=org, granted=10 * CREDIT)
    BudgetFactory(org=org, limit=CREDIT, mode="soft")
    hold = services.reserve(org=org, amount=3 * CREDIT, idempotency_key="over")
    alert = BudgetAlert.objects.get()
    assert (alert.hold_id, alert.held, alert.limit) == (hold.pk, 3 * CREDIT, CREDIT)
    assert_ledger_consistent()


def test_refusals_and_replays_end_their_transaction_and_count_once(assert_ledger_consistent):
    org = OrgFactory()
    BucketFactory(org=org, granted=2 * CREDIT)
    ok_before = operations("reserve", "ok")
    hold = HoldFactory(org=org, amount=2 * CREDIT)
    assert operations("reserve", "ok") == ok_before + 1
    with pytest.raises(InsufficientCredits):
        services.reserve(org=org, amount=1, idempotency_key="no-credit")
    assert idle()
    # The same key after the credit ran out still answers the hold it made.
    assert services.reserve(org=org, amount=2 * CREDIT, idempotency_key=hold.idempotency_key)
    assert idle()
    services.settle(hold, reason="done", final_usage=CREDIT)
    replay = services.settle(hold, reason="again")
    assert replay.replayed and idle()
    assert Bucket.objects.get(org=org).remaining == CREDIT
    assert_ledger_consistent()
