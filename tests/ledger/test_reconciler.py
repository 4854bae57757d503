"""The reconciler finds every kind of damage, and reports it as metrics and audit events."""

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import F
from prometheus_client import REGISTRY

from apps.ledger import services, tasks
from apps.ledger.models import Bucket, Budget, Hold, HoldAllocation, LedgerAuditEvent
from apps.ledger.services.reconcile import CHECKS
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, BudgetFactory, HoldFactory

pytestmark = pytest.mark.django_db


def gauge(check: str) -> float:
    return REGISTRY.get_sample_value("gantry_ledger_reconcile_violations", {"check": check})


@pytest.fixture
def ledger():
    """A small ledger that has seen every kind of movement."""
    org = OrgFactory()
    promo = BucketFactory(org=org, kind="promo", granted=5 * CREDIT)
    paid = BucketFactory(org=org, granted=50 * CREDIT)
    BudgetFactory(org=org, limit=40 * CREDIT, mode="soft")
    running = HoldFactory(org=org, amount=8 * CREDIT)
    services.meter(running, cumulative_usage=6 * CREDIT, seq=1)
    done = HoldFactory(org=org, amount=4 * CREDIT)
    services.settle(done, reason="done", final_usage=CREDIT)
    services.release(HoldFactory(org=org, amount=CREDIT), reason="cancelled")
    return {"org": org, "promo": promo, "paid": paid, "running": running, "done": done}


def test_a_consistent_ledger_has_no_violations_and_every_gauge_reads_zero(ledger):
    assert services.reconcile() == []
    assert all(gauge(check) == 0 for check in CHECKS)
    assert not LedgerAuditEvent.objects.exists()


DAMAGE = {
    "bucket_cache_mismatch": (
        "paid",
        "UPDATE ledger_bucket SET consumed = consumed + %(by)s WHERE id = %(id)s",
    ),
    "hold_inconsistent": (
        "running",
        "UPDATE ledger_hold SET captured = captured - %(by)s WHERE id = %(id)s",
    ),
    "allocation_entries_mismatch": (
        "done",
        "UPDATE ledger_holdallocation SET refunded = refunded + %(by)s, "
        "captured = captured - %(by)s WHERE id = (SELECT max(id) FROM ledger_holdallocation "
        "WHERE hold_id = %(id)s)",
    ),
    "budget_cache_mismatch": (
        "org",
        "UPDATE ledger_budget SET held = held + %(by)s WHERE org_id = %(id)s",
    ),
}


@pytest.mark.parametrize("check", list(DAMAGE))
def test_damage_to_a_cache_is_found_reported_and_resolved_once_repaired(ledger, check):
    target, sql = DAMAGE[check]

    def shift(by):
        with connection.cursor() as cursor:
            cursor.execute(sql, {"by": by, "id": ledger[target].pk})

    shift(1)
    found = services.reconcile()
    assert check in {v.check for v in found}
    assert gauge(check) >= 1
    event = LedgerAuditEvent.objects.get(check_name=check)
    assert event.resolved_at is None
    services.reconcile()  # still broken: the same event stays open, no duplicate
    assert LedgerAuditEvent.objects.filter(check_name=check).count() == 1

    shift(-1)
    assert services.reconcile() == []
    event.refresh_from_db()
    assert event.resolved_at is not None
    assert gauge(check) == 0


def test_an_expired_bucket_left_spendable_is_reported_as_spend_after_expiry(ledger):
    promo = ledger["promo"]
    Bucket.objects.filter(pk=promo.pk).update(expired_at="2000-01-01T00:00:00Z")
    found = services.reconcile(record=False)
    assert [(v.check, v.subject) for v in found] == []  # nothing left in it: still fine
    services.adjust(bucket=ledger["paid"], amount=CREDIT, reason="probe")
    Bucket.objects.filter(pk=ledger["paid"].pk).update(expired_at="2000-01-01T00:00:00Z")
    found = services.reconcile(record=False)
    assert ("spend_after_expiry", f"bucket:{ledger['paid'].pk}") in {
        (v.check, v.subject) for v in found
    }


def test_the_management_command_prints_violations_and_exits_non_zero(ledger, capsys):
    call_command("reconcile_ledger")
    assert "no violations" in capsys.readouterr().out
    Hold.objects.filter(pk=ledger["running"].pk).update(usage=F("usage") + 5)
    with pytest.raises(CommandError, match="1 ledger invariant violation"):
        call_command("reconcile_ledger", "--no-record")
    assert "hold_inconsistent" in capsys.readouterr().out
    assert not LedgerAuditEvent.objects.exists()


def test_the_periodic_task_reconciles_and_counts_violations(ledger):
    assert tasks.reconcile() == 0
    Budget.objects.update(consumed=1)
    assert tasks.reconcile() == 1


def test_a_hold_whose_allocations_do_not_add_up_is_reported(ledger):
    HoldAllocation.objects.filter(hold=ledger["running"]).update(amount=F("amount") + 1)
    checks = {v.check for v in services.reconcile(record=False)}
    assert {"hold_inconsistent", "allocation_entries_mismatch"} <= checks
