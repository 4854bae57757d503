"""Races on real PostgreSQL: many threads, each with its own connection, at once."""

import threading
import time
from collections import Counter

import pytest
from django.db import close_old_connections, connection, transaction

from apps.core.errors import InsufficientCredits
from apps.ledger import services
from apps.ledger.models import Bucket, Budget, Entry, Hold
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, BudgetFactory, HoldFactory

pytestmark = pytest.mark.django_db(transaction=True)


def run_at_once(count: int, work) -> list:
    """Run work(i) in `count` threads released together; return results or exceptions."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def worker(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # collected and asserted on by the test
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    close_old_connections()
    return results


def outcome(result) -> str:
    return type(result).__name__


def test_50_threads_reserving_from_one_bucket_never_overdraw_it(assert_ledger_consistent):
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=37 * CREDIT)

    results = run_at_once(
        50, lambda i: services.reserve(org=org, amount=CREDIT, idempotency_key=f"job-{i}")
    )

    assert Counter(map(outcome, results)) == {"Hold": 37, "InsufficientCredits": 13}
    bucket.refresh_from_db()
    assert (bucket.held, bucket.remaining) == (37 * CREDIT, 0)
    assert Hold.objects.filter(org=org).count() == 37
    assert_ledger_consistent()


def test_50_threads_reserving_uneven_amounts_get_exactly_what_the_balance_allows(
    assert_ledger_consistent,
):
    org = OrgFactory()
    BucketFactory(org=org, kind="promo", granted=40 * CREDIT)
    BucketFactory(org=org, kind="paid", granted=61 * CREDIT)
    amounts = [(i % 4 + 1) * CREDIT for i in range(50)]  # 125 credits asked, 101 there

    results = run_at_once(
        50, lambda i: services.reserve(org=org, amount=amounts[i], idempotency_key=f"job-{i}")
    )

    held = sum(r.amount for r in results if isinstance(r, Hold))
    refused = [amounts[i] for i, r in enumerate(results) if isinstance(r, InsufficientCredits)]
    assert all(isinstance(r, Hold | InsufficientCredits) for r in results)
    assert held <= 101 * CREDIT
    # Every refusal was right: when it came, its amount did not fit in what was left.
    assert 101 * CREDIT - held < min(refused)
    assert sum(b.held for b in Bucket.objects.filter(org=org)) == held
    assert_ledger_consistent()


def test_the_same_idempotency_key_from_20_threads_at_once_creates_one_hold(
    assert_ledger_consistent,
):
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=100 * CREDIT)

    results = run_at_once(
        20, lambda i: services.reserve(org=org, amount=5 * CREDIT, idempotency_key="submit-once")
    )

    assert {outcome(r) for r in results} == {"Hold"}
    assert len({r.pk for r in results}) == 1
    assert Hold.objects.filter(org=org).count() == 1
    bucket.refresh_from_db()
    assert bucket.held == 5 * CREDIT
    assert Entry.objects.filter(org=org, kind="hold").count() == 2
    assert_ledger_consistent()


def test_20_concurrent_settles_of_one_hold_move_money_once(assert_ledger_consistent):
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=100 * CREDIT)
    hold = HoldFactory(org=org, amount=10 * CREDIT)
    services.meter(hold, cumulative_usage=2 * CREDIT, seq=1)

    results = run_at_once(
        20, lambda i: services.settle(hold, reason=f"caller {i}", final_usage=(3 + i % 5) * CREDIT)
    )

    assert {outcome(r) for r in results} == {"SettleResult"}
    first = [r for r in results if not r.replayed]
    assert len(first) == 1
    assert all(r == first[0] or (r.replayed and r.captured == first[0].captured) for r in results)
    bucket.refresh_from_db()
    assert bucket.consumed == first[0].captured
    assert bucket.remaining == 100 * CREDIT - first[0].captured
    assert Entry.objects.filter(hold=hold, kind="refund").count() == 2
    assert Entry.objects.filter(hold=hold, kind="settle").count() == 2
    assert_ledger_consistent()


def test_settles_racing_the_stale_hold_recovery_close_the_hold_once(assert_ledger_consistent):
    org = OrgFactory()
    BucketFactory(org=org, granted=100 * CREDIT)
    holds = [HoldFactory(org=org, amount=CREDIT) for _ in range(10)]
    Hold.objects.filter(org=org).update(expires_at="2000-01-01T00:00:00Z")

    def work(i):
        if i % 2:
            return services.expire_stale_holds()
        return services.settle(holds[i], reason="finished", final_usage=CREDIT // 2)

    results = run_at_once(10, work)
    assert not [r for r in results if isinstance(r, Exception)]
    assert Hold.objects.filter(org=org, state="active").count() == 0
    assert Entry.objects.filter(org=org, kind="settle").count() <= 2 * 10
    assert_ledger_consistent()


def test_concurrent_folds_and_reports_never_capture_twice(usage_redis, assert_ledger_consistent):
    org = OrgFactory()
    BucketFactory(org=org, granted=1000 * CREDIT)
    holds = [HoldFactory(org=org, amount=20 * CREDIT) for _ in range(30)]

    def work(i):
        if i < 4:
            return sum(services.fold_usage_reports(batch_limit=5) for _ in range(5))
        hold = holds[i]
        for seq in [*range(1, 51), 49, 50, 30]:  # ends with a duplicate and a stale report
            services.record_usage(
                hold_id=hold.pk, attempt_key="a", cumulative_usage=seq * 1000, seq=seq
            )
        return None

    run_at_once(16, work)
    services.fold_usage_reports()
    usage = dict(Hold.objects.filter(org=org).values_list("pk", "usage"))
    assert usage == {h.pk: 50_000 if 4 <= i < 16 else 0 for i, h in enumerate(holds)}
    assert_ledger_consistent()


def test_a_budget_created_while_reservations_race_counts_each_of_them_once(
    assert_ledger_consistent,
):
    org = OrgFactory()
    BucketFactory(org=org, granted=1000 * CREDIT)

    def work(i):
        if i == 0:
            return BudgetFactory(org=org, limit=500 * CREDIT, mode="soft")
        hold = services.reserve(org=org, amount=CREDIT, idempotency_key=f"job-{i}")
        if i % 3 == 0:
            services.settle(hold, reason="done", final_usage=CREDIT // 2)
        return hold

    results = run_at_once(20, work)
    assert not [r for r in results if isinstance(r, Exception)]
    budget = Budget.objects.get(org=org)
    assert budget.held + budget.consumed > 0
    assert_ledger_consistent()


def test_a_budget_set_while_holds_of_an_org_without_one_settle_counts_each_settle_once(
    assert_ledger_consistent,
):
    # Settles of an org without a budget skip the budgets' part; set_budget waits for the
    # ones under way and counts the rest as still held, which they then discharge.
    org = OrgFactory()
    BucketFactory(org=org, granted=1000 * CREDIT)
    holds = [
        services.reserve(org=org, amount=CREDIT, idempotency_key=f"job-{i}") for i in range(19)
    ]

    def work(i):
        if i == 0:
            return services.set_budget(org=org, limit=500 * CREDIT, period="total", mode="hard")
        return services.settle(holds[i - 1], reason="done", final_usage=CREDIT // 4)

    results = run_at_once(20, work)
    assert not [r for r in results if isinstance(r, Exception)]
    budget = Budget.objects.get(org=org)
    assert (budget.held, budget.consumed) == (0, 19 * (CREDIT // 4))
    assert_ledger_consistent()


def _has_lock_waiter() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_settle_that_waited_for_a_usage_capture_refunds_against_the_captured_figures(
    assert_ledger_consistent,
):
    """A settle blocked on the hold while a meter captures must read the allocations as
    that capture left them, not as they were when the settle began waiting."""
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=100 * CREDIT)
    hold = HoldFactory(org=org, amount=10 * CREDIT)
    captured, release = threading.Event(), threading.Event()
    results: dict = {}

    def meter_in_an_open_transaction():
        try:
            with transaction.atomic():
                services.meter(hold, cumulative_usage=3 * CREDIT, seq=1)
                captured.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def settle():
        try:
            results["settle"] = services.settle(hold, reason="finished", final_usage=5 * CREDIT)
        except Exception as exc:  # asserted on below
            results["settle"] = exc
        finally:
            connection.close()

    metering = threading.Thread(target=meter_in_an_open_transaction)
    metering.start()
    assert captured.wait(timeout=30)
    settling = threading.Thread(target=settle)
    settling.start()
    _wait_for(_has_lock_waiter)  # the settle waits for the hold
    release.set()
    metering.join(timeout=30)
    settling.join(timeout=30)
    close_old_connections()

    result = results["settle"]
    assert outcome(result) == "SettleResult", result
    assert (result.captured, result.refunded) == (5 * CREDIT, 5 * CREDIT)
    bucket.refresh_from_db()
    assert (bucket.consumed, bucket.held, bucket.remaining) == (5 * CREDIT, 0, 95 * CREDIT)
    assert_ledger_consistent()
