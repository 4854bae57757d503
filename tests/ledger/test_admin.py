"""Operators' admin pages: buckets are granted (never edited), entries are read-only."""

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.ledger.models import Bucket, Budget, Entry, HoldState
from tests.factories import OrgFactory, ProjectFactory
from tests.ledger.factories import CREDIT, BucketFactory, BudgetFactory, HoldFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def ledger():
    org = OrgFactory(name="acme")
    bucket = BucketFactory(org=org, granted=10 * CREDIT)
    hold = HoldFactory(org=org, amount=2 * CREDIT)
    return org, bucket, hold


@pytest.mark.parametrize(
    "model", ["bucket", "hold", "entry", "budget", "budgetalert", "ledgerauditevent"]
)
def test_every_ledger_changelist_renders_with_search_and_filters(admin_client, ledger, model):
    url = reverse(f"admin:ledger_{model}_changelist")
    assert admin_client.get(url).status_code == 200
    assert admin_client.get(url, {"q": "acme"}).status_code == 200


def test_the_holds_page_lists_the_newest_first(admin_client, ledger):
    # Along the primary key (tests/ops/test_operator_admin.py: no sort of every hold).
    _org, _bucket, first = ledger
    later = [HoldFactory(org=first.org, amount=CREDIT) for _ in range(3)]
    page = admin_client.get(reverse("admin:ledger_hold_changelist"))
    assert page.status_code == 200
    listed = page.content.decode()
    positions = [listed.index(str(hold.pk)) for hold in [*reversed(later), first]]
    assert positions == sorted(positions)


def test_bucket_and_hold_detail_pages_are_viewable(admin_client, ledger):
    _org, bucket, hold = ledger
    assert (
        admin_client.get(reverse("admin:ledger_bucket_change", args=[bucket.pk])).status_code == 200
    )
    page = admin_client.get(reverse("admin:ledger_hold_change", args=[hold.pk]))
    assert page.status_code == 200 and b"allocations" in page.content.lower()


def test_entries_cannot_be_added_changed_or_deleted_in_the_admin(admin_client, ledger):
    entry = Entry.objects.first()
    assert admin_client.get(reverse("admin:ledger_entry_add")).status_code == 403
    assert (
        admin_client.get(reverse("admin:ledger_entry_delete", args=[entry.pk])).status_code == 403
    )
    view = admin_client.get(reverse("admin:ledger_entry_change", args=[entry.pk]))
    assert view.status_code == 200 and b'name="_save"' not in view.content
    refused = admin_client.post(
        reverse("admin:ledger_entry_change", args=[entry.pk]), {"amount": 1}
    )
    assert refused.status_code == 403


def test_adding_a_bucket_in_the_admin_grants_credit_through_the_ledger(admin_client):
    org = OrgFactory()
    project = ProjectFactory(org=org)
    url = reverse("admin:ledger_bucket_add")
    form = admin_client.get(url)
    assert form.status_code == 200 and b"Grant credits" in form.content
    key = form.context["form"]["idempotency_key"].initial
    body = {
        "org": org.pk,
        "project": project.pk,
        "kind": "grant",
        "amount": 3 * CREDIT,
        "expires_at": "",
        "idempotency_key": key,
    }
    assert admin_client.post(url, body).status_code == 302
    assert admin_client.post(url, body).status_code == 302  # a double submit grants once
    bucket = Bucket.objects.get(org=org)
    assert (bucket.granted, bucket.kind, bucket.project) == (3 * CREDIT, "grant", project)
    assert bucket.actor == "operator:admin"  # the same actor as its audit row
    assert Entry.objects.filter(bucket=bucket, kind="issue").count() == 2


def test_the_grant_form_refuses_a_project_of_another_org(admin_client):
    body = {
        "org": OrgFactory().pk,
        "project": ProjectFactory().pk,
        "kind": "paid",
        "amount": CREDIT,
        "idempotency_key": "k",
    }
    response = admin_client.post(reverse("admin:ledger_bucket_add"), body)
    assert response.status_code == 200 and b"another org" in response.content
    assert not Bucket.objects.exists()


def test_the_grant_more_action_grants_once_per_org_of_the_selection(admin_client, ledger):
    org, bucket, _hold = ledger
    second = BucketFactory(org=org)
    other = BucketFactory()
    url = reverse("admin:ledger_bucket_changelist")
    selection = {"action": "grant_more", ACTION_CHECKBOX_NAME: [bucket.pk, second.pk, other.pk]}
    page = admin_client.post(url, selection)
    assert page.status_code == 200 and b"Grant credits to 2 org(s)" in page.content
    done = admin_client.post(
        url,
        {**selection, "apply": "1", "kind": "promo", "amount": CREDIT, "idempotency_key": "once"},
    )
    assert done.status_code == 302
    assert Bucket.objects.filter(kind="promo", granted=CREDIT).count() == 2
    assert Bucket.objects.filter(org=org, kind="promo").count() == 1


def test_the_settle_action_closes_active_holds_once(admin_client, ledger):
    _org, _bucket, hold = ledger
    url = reverse("admin:ledger_hold_changelist")
    body = {"action": "settle_at_metered_usage", ACTION_CHECKBOX_NAME: [hold.pk]}
    admin_client.post(url, body)
    admin_client.post(url, body)
    hold.refresh_from_db()
    assert hold.state == HoldState.SETTLED and hold.refunded == 2 * CREDIT
    assert Entry.objects.filter(hold=hold, kind="refund").count() == 2


def test_a_budget_saved_in_the_admin_goes_through_set_budget(admin_client, ledger):
    org, _bucket, _hold = ledger
    body = {"org": org.pk, "limit": 5 * CREDIT, "period": "month", "mode": "hard"}
    assert admin_client.post(reverse("admin:ledger_budget_add"), body).status_code == 302
    budget = Budget.objects.get()
    assert budget.held == 2 * CREDIT  # the open hold was counted


def test_the_entry_list_shows_one_row_per_move_newest_first_and_both_legs_on_request(
    admin_client, ledger
):
    org, bucket, _hold = ledger
    HoldFactory(org=org, amount=3 * CREDIT)
    url = reverse("admin:ledger_entry_changelist")

    def listed(**query):
        response = admin_client.get(url, query)
        assert response.status_code == 200
        return list(response.context["cl"].result_list)

    moves = listed()
    assert len(moves) == Entry.objects.filter(amount__gt=0).count() >= 3  # grant, two holds
    assert all(entry.amount > 0 for entry in moves)
    assert [e.created_at for e in moves] == sorted((e.created_at for e in moves), reverse=True)
    both = listed(legs="both")
    assert len(both) == Entry.objects.count() == 2 * len(moves)
    assert [e.amount for e in listed(q=str(bucket.pk), legs="both") if e.amount < 0]


def test_the_hold_and_entry_lists_read_as_many_queries_for_many_rows_as_for_one(
    admin_client, ledger
):
    org, _bucket, _hold = ledger

    def queries(model):
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(reverse(f"admin:ledger_{model}_changelist")).status_code == 200
        return len(captured.captured_queries)

    before = {model: queries(model) for model in ("hold", "entry", "bucket", "budget")}
    for n in range(4):
        project = ProjectFactory(org=org, name=f"p{n}")
        HoldFactory(org=org, project=project, amount=CREDIT)
        BudgetFactory(org=org, project=project, limit=100 * CREDIT)
    assert {model: queries(model) for model in before} == before
