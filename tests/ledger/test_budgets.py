"""Hierarchical budgets org → project → user: hard ones refuse, soft ones alert."""

from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from apps.core.errors import BudgetExceeded, GantryError
from apps.ledger import services
from apps.ledger.models import Budget, BudgetAlert, Entry, Hold
from tests.factories import OrgFactory, ProjectFactory, UserFactory
from tests.ledger.factories import CREDIT, BucketFactory, BudgetFactory, HoldFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def org():
    org = OrgFactory()
    BucketFactory(org=org, granted=1000 * CREDIT)
    return org


def test_a_soft_budget_exceeded_allows_the_reservation_and_records_an_alert(
    org, assert_ledger_consistent
):
    budget = BudgetFactory(org=org, limit=10 * CREDIT, mode="soft")
    HoldFactory(org=org, amount=8 * CREDIT)
    assert not BudgetAlert.objects.exists()

    over = HoldFactory(org=org, amount=5 * CREDIT)

    budget.refresh_from_db()
    assert budget.held == 13 * CREDIT
    alert = BudgetAlert.objects.get()
    assert (alert.budget, alert.hold_id, alert.amount) == (budget, over.pk, 5 * CREDIT)
    assert (alert.held, alert.consumed, alert.limit) == (13 * CREDIT, 0, 10 * CREDIT)
    assert_ledger_consistent()


def test_a_hard_budget_refuses_and_nothing_is_held(org, assert_ledger_consistent):
    budget = BudgetFactory(org=org, limit=10 * CREDIT, mode="hard")
    HoldFactory(org=org, amount=8 * CREDIT)
    entries = Entry.objects.count()

    with pytest.raises(BudgetExceeded) as refused:
        services.reserve(org=org, amount=3 * CREDIT, idempotency_key="over")

    assert refused.value.status_code == 403
    budget.refresh_from_db()
    assert budget.held == 8 * CREDIT
    assert not Hold.objects.filter(idempotency_key="over").exists()
    assert Entry.objects.count() == entries
    assert services.reserve(org=org, amount=2 * CREDIT, idempotency_key="fits")
    assert_ledger_consistent()


def test_a_hard_budget_set_after_the_org_reserved_without_one_is_enforced_from_the_next_hold(
    org, assert_ledger_consistent
):
    # The org's first holds go without the budgets' part (it has none); the budget then
    # counts them, and the next reservation finds the budget although this process last
    # saw the org without one.
    services.reserve(org=org, amount=8 * CREDIT, idempotency_key="before")
    services.set_budget(org=org, limit=10 * CREDIT, period="month", mode="hard")

    with pytest.raises(BudgetExceeded):
        services.reserve(org=org, amount=3 * CREDIT, idempotency_key="over")
    services.reserve(org=org, amount=2 * CREDIT, idempotency_key="fits")

    budget = Budget.objects.get(org=org)
    assert budget.held == 10 * CREDIT
    assert not Hold.objects.filter(idempotency_key="over").exists()
    assert_ledger_consistent()


def budgets_found() -> float:
    labels = {"op": "reserve", "outcome": "budgets_found"}
    return REGISTRY.get_sample_value("gantry_ledger_operations_total", labels) or 0


def test_an_org_with_budgets_costs_one_statement_more_once_then_is_reserved_for_with_them(org):
    BudgetFactory(org=org, limit=100 * CREDIT, mode="soft")
    other = OrgFactory()
    BucketFactory(org=other, granted=100 * CREDIT)
    before = budgets_found()

    for n in range(3):
        services.reserve(org=org, amount=CREDIT, idempotency_key=f"with-{n}")
        services.reserve(org=other, amount=CREDIT, idempotency_key=f"without-{n}")

    assert budgets_found() == before + 1  # the org's first hold only; never the other's
    assert Budget.objects.get(org=org).held == 3 * CREDIT


def test_every_level_of_the_hierarchy_is_checked_org_project_user(org):
    project = ProjectFactory(org=org)
    ana, bo = UserFactory(org=org), UserFactory(org=org)
    BudgetFactory(org=org, limit=100 * CREDIT)
    BudgetFactory(org=org, project=project, limit=20 * CREDIT)
    BudgetFactory(org=org, user=ana, limit=5 * CREDIT)
    BudgetFactory(org=org, project=project, user=bo, limit=12 * CREDIT)

    HoldFactory(org=org, project=project, user=ana, amount=5 * CREDIT)
    with pytest.raises(BudgetExceeded, match="user"):
        HoldFactory(org=org, user=ana, amount=1)
    HoldFactory(org=org, project=project, user=bo, amount=12 * CREDIT)
    with pytest.raises(BudgetExceeded, match="project"):
        HoldFactory(org=org, project=project, amount=4 * CREDIT)
    HoldFactory(org=org, amount=80 * CREDIT)  # no project: only the org budget applies
    with pytest.raises(BudgetExceeded, match="org"):
        HoldFactory(org=org, amount=4 * CREDIT)


def test_settling_moves_a_hold_from_held_to_consumed_and_frees_the_difference(
    org, assert_ledger_consistent
):
    budget = BudgetFactory(org=org, limit=10 * CREDIT)
    hold = HoldFactory(org=org, amount=10 * CREDIT)
    services.settle(hold, reason="done", final_usage=4 * CREDIT)
    budget.refresh_from_db()
    assert (budget.held, budget.consumed) == (0, 4 * CREDIT)
    HoldFactory(org=org, amount=6 * CREDIT)
    with pytest.raises(BudgetExceeded):
        HoldFactory(org=org, amount=1)
    assert_ledger_consistent()


def test_a_hold_reserved_before_the_org_had_a_budget_is_discharged_from_the_budget_set_since(
    org, assert_ledger_consistent
):
    # Reserved without the budgets' part; the budget set later counts the hold, so its
    # settlement must discharge it although the org had no budget when it was reserved.
    hold = services.reserve(org=org, amount=6 * CREDIT, idempotency_key="early")
    services.set_budget(org=org, limit=10 * CREDIT, period="month", mode="hard")

    services.settle(hold, reason="done", final_usage=2 * CREDIT)

    budget = Budget.objects.get(org=org)
    assert (budget.held, budget.consumed) == (0, 2 * CREDIT)
    services.reserve(org=org, amount=8 * CREDIT, idempotency_key="fits now")
    assert_ledger_consistent()


def test_an_extension_counts_against_the_budget_like_a_reservation(org):
    budget = BudgetFactory(org=org, limit=10 * CREDIT)
    hold = HoldFactory(org=org, amount=6 * CREDIT)
    with pytest.raises(BudgetExceeded):
        services.extend(hold, amount=5 * CREDIT)
    services.extend(hold, amount=4 * CREDIT)
    budget.refresh_from_db()
    assert budget.held == 10 * CREDIT


def test_a_new_budget_counts_the_holds_already_open_and_settled_beneath_it(
    org, assert_ledger_consistent
):
    project = ProjectFactory(org=org)
    open_hold = HoldFactory(org=org, project=project, amount=3 * CREDIT)
    done = HoldFactory(org=org, project=project, amount=4 * CREDIT)
    services.settle(done, reason="done", final_usage=CREDIT)
    HoldFactory(org=org, amount=50 * CREDIT)  # another scope

    budget = services.set_budget(
        org=org, project=project, limit=5 * CREDIT, period="month", mode="hard"
    )

    assert (budget.held, budget.consumed) == (3 * CREDIT, CREDIT)
    assert budget.period_start.day == 1
    with pytest.raises(BudgetExceeded):
        HoldFactory(org=org, project=project, amount=2 * CREDIT)
    services.settle(open_hold, reason="done", final_usage=0)
    again = services.set_budget(
        org=org, project=project, limit=5 * CREDIT, period="month", mode="hard"
    )
    assert again.pk == budget.pk and (again.held, again.consumed) == (0, CREDIT)
    assert Budget.objects.filter(org=org).count() == 1
    assert_ledger_consistent()


def test_a_month_budget_starts_counting_consumption_afresh_each_month(org):
    budget = BudgetFactory(org=org, limit=10 * CREDIT, period="month")
    hold = HoldFactory(org=org, amount=9 * CREDIT)
    services.settle(hold, reason="done", final_usage=9 * CREDIT)
    with pytest.raises(BudgetExceeded):
        HoldFactory(org=org, amount=2 * CREDIT)
    # The month turns: the cached period is last month's.
    last_month = budget.period_start - timedelta(days=15)
    Budget.objects.filter(pk=budget.pk).update(period_start=last_month.replace(day=1))
    HoldFactory(org=org, amount=10 * CREDIT)
    budget.refresh_from_db()
    assert (budget.held, budget.consumed) == (10 * CREDIT, 0)
    assert budget.period_start.month != last_month.month


def test_a_total_budget_never_resets(org):
    budget = BudgetFactory(org=org, limit=10 * CREDIT, period="total")
    services.settle(HoldFactory(org=org, amount=9 * CREDIT), reason="done", final_usage=9 * CREDIT)
    budget.refresh_from_db()
    assert (budget.consumed, budget.period_start) == (9 * CREDIT, None)
    with pytest.raises(BudgetExceeded):
        HoldFactory(org=org, amount=2 * CREDIT)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"limit": -1}, "limit"),
        ({"period": "week"}, "period"),
        ({"mode": "strict"}, "mode"),
        ({"project": "other-org"}, "project"),
        ({"user": "other-org"}, "user"),
    ],
)
def test_an_invalid_budget_is_refused_naming_the_field(org, changes, field):
    foreign = {"project": ProjectFactory(), "user": UserFactory()}
    changes = {k: foreign[k] if v == "other-org" else v for k, v in changes.items()}
    with pytest.raises(GantryError) as refused:
        services.set_budget(
            **{"org": org, "limit": CREDIT, "period": "month", "mode": "hard", **changes}
        )
    assert refused.value.field == field
