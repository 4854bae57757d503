"""Lanes: a large grant is issued as several bucket rows of one rank, and a large budget is
kept in several rows, so that the holds of one busy org draw and charge side by side
instead of queueing on one row."""

from collections import Counter

import pytest
from django.db import transaction
from django.db.models import Q, Sum
from django.test import override_settings

from apps.accounts.models import Org
from apps.core.errors import BudgetExceeded, InsufficientCredits
from apps.ledger import selectors, services
from apps.ledger.models import Bucket, Budget, BudgetAlert, Hold, HoldAllocation
from apps.ledger.services.buckets import lane_shares
from apps.ledger.services.holds import preferred_lane
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT
from tests.ledger.test_races import outcome, run_at_once

# A lane holds at least 10 credits here: a 40-credit grant is four lanes of 10.
LANES = override_settings(GANTRY_LEDGER_BUCKET_LANES=4, GANTRY_LEDGER_LANE_MIN=10 * CREDIT)


def lanes_of(bucket) -> list[Bucket]:
    return list(Bucket.objects.filter(Q(pk=bucket.pk) | Q(lane_of=bucket.pk)).order_by("lane"))


def drawn(hold) -> dict:
    """{bucket id: amount} of the hold's allocations."""
    return dict(HoldAllocation.objects.filter(hold=hold).values_list("bucket_id", "amount"))


def test_lane_shares_add_up_and_differ_by_at_most_one_micro_credit():
    with LANES:
        assert lane_shares(19 * CREDIT) == [19 * CREDIT]  # under two lanes' minimum
        assert lane_shares(20 * CREDIT) == [10 * CREDIT, 10 * CREDIT]
        shares = lane_shares(40 * CREDIT + 3)
        assert shares == [10 * CREDIT + 1] * 3 + [10 * CREDIT]
        assert lane_shares(10**15) == [10**15 // 4] * 4  # never more than the setting


@pytest.mark.django_db
def test_a_large_grant_is_four_lanes_that_tenants_see_as_one_bucket(
    operator, assert_ledger_consistent
):
    org = OrgFactory()
    with LANES:
        response = operator.post(
            "/v1/credits/grants",
            {"org": str(org.id), "amount": 40 * CREDIT + 3, "kind": "paid"},
            format="json",
            HTTP_IDEMPOTENCY_KEY="big-grant",
        )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["amount"], body["remaining"]) == (40 * CREDIT + 3, 40 * CREDIT + 3)

    first = Bucket.objects.get(pk=body["id"])
    lanes = lanes_of(first)
    assert [lane.lane for lane in lanes] == [0, 1, 2, 3]
    assert sum(lane.granted for lane in lanes) == 40 * CREDIT + 3
    assert {lane.created_at for lane in lanes} == {first.created_at}
    assert all(lane.lane_of_id == first.pk for lane in lanes[1:])

    with LANES:
        hold = services.reserve(org=org, amount=3 * CREDIT, idempotency_key="job-1")
    balance = selectors.balance(org=org)
    assert [b["id"] for b in balance["buckets"]] == [first.pk]
    assert (balance["available"], balance["held"]) == (37 * CREDIT + 3, 3 * CREDIT)
    entries = selectors.entries_of(org=org).filter(hold=hold)
    assert {entry.grant_id for entry in entries} == {first.pk}
    assert_ledger_consistent()


@pytest.mark.django_db
def test_the_same_grant_replayed_answers_the_first_bucket_and_issues_nothing_more():
    org = OrgFactory()
    with LANES:
        first = services.grant(org=org, kind="paid", amount=40 * CREDIT, idempotency_key="g")
        again = services.grant(org=org, kind="paid", amount=40 * CREDIT, idempotency_key="g")
    assert again.pk == first.pk
    assert Bucket.objects.filter(org=org).aggregate(s=Sum("granted"))["s"] == 40 * CREDIT


@pytest.mark.django_db
def test_a_sessions_holds_draw_from_its_lane_then_from_the_next_one_with_funds(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        grant = services.grant(org=org, kind="paid", amount=40 * CREDIT)
        holds = [
            services.reserve(org=org, amount=CREDIT, idempotency_key=f"job-{i}") for i in range(12)
        ]
    lanes = lanes_of(grant)
    own = lanes[preferred_lane() % 4].pk
    assert [next(iter(drawn(hold))) for hold in holds[:10]] == [own] * 10  # one lane each
    (next_lane,) = {next(iter(drawn(hold))) for hold in holds[10:]}
    assert next_lane != own and len(drawn(holds[11])) == 1
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_sessions_are_numbered_in_turn_and_keep_their_lane_number():
    lanes = run_at_once(8, lambda i: (preferred_lane(), preferred_lane()))
    assert all(first == again for first, again in lanes)  # one number per session
    assert {first % 8 for first, _ in lanes} == set(range(8))  # eight sessions, eight lanes


@pytest.mark.django_db(transaction=True)
def test_concurrent_sessions_of_one_org_draw_from_different_lanes(assert_ledger_consistent):
    org = OrgFactory()
    with LANES:
        grant = services.grant(org=org, kind="paid", amount=40 * CREDIT)
        holds = run_at_once(
            8, lambda i: services.reserve(org=org, amount=CREDIT, idempotency_key=f"job-{i}")
        )
    assert {type(hold) for hold in holds} == {Hold}
    used = {bucket for hold in holds for bucket in drawn(hold)}
    assert used <= {lane.pk for lane in lanes_of(grant)} and len(used) > 1
    assert_ledger_consistent()


@pytest.mark.django_db
def test_a_hold_larger_than_its_lane_draws_across_the_lanes_of_the_grant(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        grant = services.grant(org=org, kind="paid", amount=40 * CREDIT)
        hold = services.reserve(org=org, amount=35 * CREDIT, idempotency_key="big")
    assert sum(drawn(hold).values()) == 35 * CREDIT
    assert set(drawn(hold)) <= {lane.pk for lane in lanes_of(grant)}
    with LANES, pytest.raises(InsufficientCredits):
        services.reserve(org=org, amount=6 * CREDIT, idempotency_key="too-much")
    assert_ledger_consistent()


@pytest.mark.django_db
def test_no_paid_credit_is_drawn_while_any_lane_of_an_earlier_promo_has_funds(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        promo = services.grant(org=org, kind="promo", amount=40 * CREDIT)
        paid = services.grant(org=org, kind="paid", amount=40 * CREDIT)
        promo_lanes = {lane.pk for lane in lanes_of(promo)}
        paid_lanes = {lane.pk for lane in lanes_of(paid)}
        # 7 credits at a time: lanes of 10 run dry unevenly, and a hold whose chosen
        # promo lane is short must still take promo credit from the other lanes first.
        holds = [
            services.reserve(org=org, amount=7 * CREDIT, idempotency_key=f"job-{i}")
            for i in range(8)
        ]
    promo_left = sum(lane.remaining for lane in lanes_of(promo))
    for hold in holds[:5]:  # 35 of the promo's 40 credits
        assert set(drawn(hold)) <= promo_lanes
    assert promo_left == 0
    sixth = drawn(holds[5])
    assert sum(v for k, v in sixth.items() if k in promo_lanes) == 5 * CREDIT
    assert sum(v for k, v in sixth.items() if k in paid_lanes) == 2 * CREDIT
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_40_threads_reserving_from_the_lanes_of_one_grant_never_overdraw_them(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        grant = services.grant(org=org, kind="paid", amount=40 * CREDIT)
        # 3 credits each: 13 fit in 40, but a lane of 10 serves only 3; the rest must
        # come from fallbacks that gather the remainders across lanes.
        results = run_at_once(
            40,
            lambda i: services.reserve(org=org, amount=3 * CREDIT, idempotency_key=f"job-{i}"),
        )
    assert Counter(map(outcome, results)) == {"Hold": 13, "InsufficientCredits": 27}
    lanes = lanes_of(grant)
    assert sum(lane.held for lane in lanes) == 39 * CREDIT
    assert sum(lane.remaining for lane in lanes) == CREDIT
    assert Hold.objects.filter(org=org).count() == 13
    assert_ledger_consistent()


# --- budgets ------------------------------------------------------------------------------


def budget_lanes(budget) -> list[Budget]:
    return list(Budget.objects.filter(Q(pk=budget.pk) | Q(lane_of=budget.pk)).order_by("lane"))


@pytest.mark.django_db
def test_a_large_budget_is_four_lanes_whose_shares_add_up_to_its_limit(
    operator, assert_ledger_consistent
):
    org = OrgFactory()
    with LANES:
        services.grant(org=org, kind="paid", amount=100 * CREDIT)
        services.reserve(org=org, amount=5 * CREDIT, idempotency_key="before")
        response = operator.put(
            "/v1/budgets",
            {"org": str(org.id), "limit": 40 * CREDIT, "period": "month", "mode": "hard"},
            format="json",
        )
    assert response.status_code == 200, response.content
    assert (response.json()["limit"], response.json()["held"]) == (40 * CREDIT, 5 * CREDIT)
    lanes = budget_lanes(Budget.objects.get(org=org, lane=0))
    assert [lane.share for lane in lanes] == [10 * CREDIT] * 4
    assert {lane.lanes for lane in lanes} == {4} and not any(lane.unbalanced for lane in lanes)
    assert sum(lane.held for lane in lanes) == 5 * CREDIT  # the earlier hold, in its lane
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_40_threads_against_a_hard_budget_in_lanes_never_take_it_over_its_limit(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        services.grant(org=org, kind="paid", amount=1000 * CREDIT)
        budget = services.set_budget(org=org, limit=40 * CREDIT, period="total", mode="hard")
        # 3 credits each: a lane's share of 10 takes three; the 13th needs the whole budget.
        results = run_at_once(
            40,
            lambda i: services.reserve(org=org, amount=3 * CREDIT, idempotency_key=f"job-{i}"),
        )
    assert Counter(map(outcome, results)) == {"Hold": 13, "BudgetExceeded": 27}
    assert selectors.budget_usage(budget) == (39 * CREDIT, 0)
    assert_ledger_consistent()


@pytest.mark.django_db
def test_a_budget_lowered_below_its_usage_takes_no_hold_until_usage_is_back_under_it(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        services.grant(org=org, kind="paid", amount=1000 * CREDIT)
        holds = [
            services.reserve(org=org, amount=6 * CREDIT, idempotency_key=f"job-{i}")
            for i in range(5)
        ]
        budget = services.set_budget(org=org, limit=20 * CREDIT, period="total", mode="hard")
        assert any(lane.unbalanced for lane in budget_lanes(budget))
        # Settling one hold frees room in its lane, but 24 of 20 are still in use.
        services.settle(holds[0], reason="done", final_usage=0)
        with pytest.raises(BudgetExceeded):
            services.reserve(org=org, amount=CREDIT, idempotency_key="over")
        for hold in holds[1:3]:
            services.settle(hold, reason="done", final_usage=0)
        # 12 of 20 in use: the complete check takes it and rebalances the lanes.
        services.reserve(org=org, amount=8 * CREDIT, idempotency_key="fits")
    assert selectors.budget_usage(budget) == (20 * CREDIT, 0)
    with LANES, pytest.raises(BudgetExceeded):
        services.reserve(org=org, amount=1, idempotency_key="one-too-many")
    assert_ledger_consistent()


@pytest.mark.django_db
def test_a_soft_budget_in_lanes_allows_the_hold_and_records_one_alert_with_its_totals(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        services.grant(org=org, kind="paid", amount=1000 * CREDIT)
        budget = services.set_budget(org=org, limit=20 * CREDIT, period="month", mode="soft")
        for i in range(3):
            services.reserve(org=org, amount=6 * CREDIT, idempotency_key=f"job-{i}")
        assert not BudgetAlert.objects.exists()
        hold = services.reserve(org=org, amount=6 * CREDIT, idempotency_key="over")
    (alert,) = BudgetAlert.objects.all()
    assert (alert.budget_id, alert.hold_id) == (budget.pk, hold.pk)
    assert (alert.held, alert.consumed, alert.limit) == (24 * CREDIT, 0, 20 * CREDIT)
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_a_fallback_inside_the_callers_transaction_keeps_that_transaction(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        services.grant(org=org, kind="paid", amount=40 * CREDIT)
        with transaction.atomic():
            OrgFactory(name="written-before")  # the caller's own work in the transaction
            # 35 of 40 credits: no lane has that much, so the lane statement falls back
            # (rolled back to its savepoint) and the complete one draws from every lane.
            hold = services.reserve(org=org, amount=35 * CREDIT, idempotency_key="big")
            assert len(drawn(hold)) == 4
    assert Hold.objects.filter(pk=hold.pk).exists()
    assert Org.objects.filter(name="written-before").exists()
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_without_a_savepoint_a_fallback_asks_the_caller_to_run_its_transaction_again(
    assert_ledger_consistent,
):
    org = OrgFactory()
    with LANES:
        services.grant(org=org, kind="paid", amount=40 * CREDIT)
        with pytest.raises(services.ReservationRetry), transaction.atomic():
            OrgFactory(name="written-before")
            services.reserve(org=org, amount=35 * CREDIT, idempotency_key="big", savepoint=False)
        # The whole transaction was rolled back; run again, it draws from every lane.
        assert not Org.objects.filter(name="written-before").exists()
        with transaction.atomic():
            OrgFactory(name="written-before")
            hold = services.reserve(
                org=org, amount=35 * CREDIT, idempotency_key="big", savepoint=False
            )
    assert len(drawn(hold)) == 4
    assert Org.objects.filter(name="written-before").exists()
    assert_ledger_consistent()


@pytest.mark.django_db(transaction=True)
def test_a_reservation_without_a_savepoint_that_lacks_credit_aborts_the_callers_transaction():
    org = OrgFactory()
    services.grant(org=org, kind="paid", amount=10 * CREDIT)
    with pytest.raises(InsufficientCredits, match="10000000 µc available"), transaction.atomic():
        OrgFactory(name="written-before")
        services.reserve(org=org, amount=11 * CREDIT, idempotency_key="big", savepoint=False)
    assert not Org.objects.filter(name="written-before").exists()
    assert not Hold.objects.filter(org=org).exists()
