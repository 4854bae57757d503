"""The operators' admin through Django's test client: every page opens with data present,
and every action goes through its service and leaves a row in the audit trail."""

import re
import uuid
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import IntegrityError, InternalError, connection, transaction
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.accounts.models import APIKey, OperatorAction, Org
from apps.accounts.models import User as TenantUser
from apps.fleet import liveness
from apps.fleet.models import GpuType, Node, NodeState
from apps.jobs import queue_state
from apps.jobs.models import Attempt, Job, JobStatus, QuarantinedFingerprint
from apps.jobs.queue_state import QueueState
from apps.jobs.services.cancel import cancel_job
from apps.ledger.models import Bucket, Budget, BudgetMode, HoldState
from tests.db_plans import sorts_whole
from tests.factories import ProjectFactory
from tests.jobs.factories import JobFactory, reset_job_state
from tests.ops.audit_world import CREDIT, funded, platform, submitted
from tests.scheduler.factories import NodeFactory

pytestmark = pytest.mark.django_db

NODES = reverse("admin:fleet_node_changelist")
JOBS = reverse("admin:jobs_job_changelist")


@pytest.fixture(autouse=True)
def _fresh_state(db, settings):
    """Known GPU types and empty rate-limit buckets (Redis is shared across tests); a fast
    password hasher for the admin's test user (autouse runs before admin_client)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    reset_job_state()


def actions(action: str) -> list[OperatorAction]:
    return list(OperatorAction.objects.filter(action=action).order_by("id"))


def test_every_registered_model_opens_its_changelist_change_and_add_pages(admin_client):
    platform()
    request = RequestFactory().get("/")
    request.user = get_user_model().objects.get(username="admin")  # admin_client's
    failures = []
    for model, model_admin in admin.site._registry.items():
        info = (model._meta.app_label, model._meta.model_name)
        obj = model._default_manager.first()
        assert obj is not None, f"no {info} row: the scenario must fill every admin table"
        pages = [
            reverse("admin:{}_{}_changelist".format(*info)),
            reverse("admin:{}_{}_change".format(*info), args=[quote(obj.pk)]),
        ]
        if model_admin.has_add_permission(request):
            pages.append(reverse("admin:{}_{}_add".format(*info)))
        for url in pages:
            status = admin_client.get(url).status_code
            if status != 200:
                failures.append(f"{url}: {status}")
    for url in (reverse("admin:index"), reverse("admin:fleet"), reverse("admin:audit_trail")):
        status = admin_client.get(url).status_code
        if status != 200:
            failures.append(f"{url}: {status}")
    assert failures == []


# The changelists of tables that grow with traffic (a row or more per job): they must not
# count the whole table beside the rows found (a second full count at every page view).
GROWING_CHANGELISTS = ("jobs_job", "ledger_hold", "ledger_entry", "ledger_budgetalert")
GROWING_CHANGELISTS += ("scheduler_dispatchdecision",)


@pytest.mark.parametrize("changelist", GROWING_CHANGELISTS)
def test_a_search_on_a_table_that_grows_with_traffic_counts_only_what_it_found(
    admin_client, changelist
):
    platform()
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(reverse(f"admin:{changelist}_changelist"), {"q": str(uuid.uuid4())})
    assert page.status_code == 200
    counts = [q["sql"] for q in queries if q["sql"].startswith("SELECT COUNT(*)")]
    assert len(counts) == 1, counts


# Lists of tables that grow with traffic or with the tenants (each named like its table):
# each page must be read along an index, not by sorting the whole table.
LISTS_READ_ALONG_AN_INDEX = (
    "accounts_apikey",
    "accounts_operatoraction",
    "accounts_org",
    "accounts_project",
    "accounts_user",
    "jobs_job",
    "ledger_budgetalert",
    "ledger_entry",
    "ledger_hold",
    "scheduler_dispatchdecision",
)


@pytest.mark.parametrize("changelist", LISTS_READ_ALONG_AN_INDEX)
def test_a_list_that_grows_is_read_along_an_index_not_sorted_whole(admin_client, changelist):
    platform()
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get(reverse(f"admin:{changelist}_changelist")).status_code == 200
    rows = [q["sql"] for q in queries if q["sql"].startswith(f'SELECT "{changelist}"."')]
    assert rows, [q["sql"][:120] for q in queries]
    assert not sorts_whole(rows[0])


def test_the_index_opens_with_the_fleet_and_the_audit_trail(admin_client):
    page = admin_client.get(reverse("admin:index")).content.decode()
    assert "Gantry operations" in page
    assert reverse("admin:fleet") in page and reverse("admin:audit_trail") in page


def test_the_fleet_page_shows_what_runs_on_each_gpu(admin_client):
    world = platform()
    page = admin_client.get(reverse("admin:fleet")).content.decode()

    busy = page[page.index(f'id="node-{world.busy_node.name}"') :]
    busy = busy[: busy.index("</table>")]
    assert busy.count('gantry-badge busy">busy') == 2  # both GPUs held by the 2-GPU job
    assert reverse("admin:jobs_job_change", args=[world.running.pk]) in busy
    assert world.paid.name in busy and "tier-paid" in busy
    assert 'gantry-badge running">running' in busy  # the attempt and the job
    idle = page[page.index(f'id="node-{world.idle_node.name}"') :]
    idle = idle[: idle.index("</table>")]
    assert 'gantry-badge free">free' in idle and "A100" in idle
    assert "queued · free" in page  # the queue per tier


def test_draining_and_undraining_from_the_fleet_page_is_recorded(admin_client):
    node = NodeFactory(gpus=1)
    fleet = reverse("admin:fleet")

    response = admin_client.post(fleet, {"node": node.name, "op": "drain"}, follow=True)

    assert Node.objects.get(pk=node.pk).state == NodeState.DRAINING
    assert [str(m) for m in response.context["messages"]] == [f"Node {node.name} is now draining."]
    assert 'gantry-badge draining">draining' in response.content.decode()
    admin_client.post(fleet, {"node": node.name, "op": "undrain"})
    assert Node.objects.get(pk=node.pk).state == NodeState.ACTIVE
    drain, undrain = actions("node.drain")[0], actions("node.undrain")[0]
    assert (drain.actor, drain.target_id, drain.before, drain.after) == (
        "operator:admin",
        node.name,
        {"state": "active"},
        {"state": "draining"},
    )
    assert (undrain.before, undrain.after) == ({"state": "draining"}, {"state": "active"})


def test_node_actions_of_the_changelist_are_recorded_and_a_refusal_too(admin_client):
    world = platform()
    selection = [str(world.busy_node.pk), str(world.idle_node.pk)]

    admin_client.post(NODES, {"action": "drain", ACTION_CHECKBOX_NAME: selection})
    response = admin_client.post(
        NODES, {"action": "remove", ACTION_CHECKBOX_NAME: selection}, follow=True
    )

    assert "drain it first" in response.content.decode()  # the busy node stays
    assert Node.objects.get(pk=world.busy_node.pk).state == NodeState.DRAINING
    assert not Node.objects.filter(pk=world.idle_node.pk).exists()  # never ran anything
    assert {a.target_id for a in actions("node.drain") if a.actor == "operator:admin"} == {
        world.busy_node.name,
        world.idle_node.name,
    }
    removes = {a.target_id: a for a in actions("node.remove")}
    assert removes[world.idle_node.name].outcome == "done"
    assert removes[world.idle_node.name].after == {"state": "deleted"}
    refused = removes[world.busy_node.name]
    assert refused.outcome == "refused" and "drain it first" in refused.note


def test_cancelling_jobs_records_each_with_its_status_before_and_after(admin_client):
    org = funded("cancels", "paid")
    queued = submitted(org)
    finished = JobFactory(org=org, status=JobStatus.SUCCEEDED)

    admin_client.post(
        JOBS,
        {"action": "cancel_jobs", ACTION_CHECKBOX_NAME: [str(queued.pk), str(finished.pk)]},
    )

    queued.refresh_from_db()
    assert queued.status == JobStatus.CANCELLED and queued.hold.state == HoldState.RELEASED
    done, refused = sorted(actions("job.cancel"), key=lambda a: a.outcome)
    assert (done.outcome, done.job_id, done.org_id) == ("done", queued.pk, org.pk)
    assert (done.before, done.after) == (
        {"status": "queued"},
        {"status": "cancelled", "cancel_requested": False},
    )
    assert refused.outcome == "refused" and refused.job_id == finished.pk
    assert "already finished" in refused.note


def test_requeuing_a_dead_lettered_job_twice_is_one_copy_and_one_audit_row(admin_client):
    org = funded("requeues", "paid")
    dead = submitted(org)
    cancel_job(dead.pk, actor="test")  # a finished job; make it a dead letter below
    Job.objects.filter(pk=dead.pk).update(status=JobStatus.FAILED)
    body = {"action": "requeue_dead_lettered", ACTION_CHECKBOX_NAME: [str(dead.pk)]}

    admin_client.post(JOBS, body)
    admin_client.post(JOBS, body)

    [copy] = Job.objects.exclude(pk=dead.pk)
    [row] = actions("job.requeue")
    assert row.after == {"requeued_as": str(copy.pk), "copy_status": "queued"}
    assert (row.job_id, row.before) == (dead.pk, {"status": "failed"})


def test_granting_credits_in_the_admin_is_recorded_once_per_form(admin_client):
    org = funded("grants", "enterprise")
    url = reverse("admin:ledger_bucket_add")
    key = admin_client.get(url).context["form"]["idempotency_key"].initial
    body = {"org": org.pk, "kind": "promo", "amount": 5 * CREDIT, "idempotency_key": key}

    assert admin_client.post(url, body).status_code == 302
    assert admin_client.post(url, body).status_code == 302  # a double submit grants once

    bucket = Bucket.objects.get(org=org, kind="promo")
    [row] = actions("credits.grant")
    assert (row.target_id, row.org_id, row.actor) == (str(bucket.pk), org.pk, "operator:admin")
    assert row.after["amount"] == 5 * CREDIT and row.after["kind"] == "promo"


def test_the_grant_more_action_records_one_grant_per_org(admin_client):
    first, second = funded("first", "paid"), funded("second", "free")
    selection = {
        "action": "grant_more",
        ACTION_CHECKBOX_NAME: [str(b.pk) for b in Bucket.objects.all()],
    }
    admin_client.post(
        reverse("admin:ledger_bucket_changelist"),
        {**selection, "apply": "1", "kind": "grant", "amount": CREDIT, "idempotency_key": "k1"},
    )
    assert {row.org_id for row in actions("credits.grant")} == {first.pk, second.pk}


def test_settling_a_hold_in_the_admin_is_recorded_with_its_state_before_and_after(admin_client):
    org = funded("settles", "paid")
    hold = submitted(org).hold
    url = reverse("admin:ledger_hold_changelist")
    body = {"action": "settle_at_metered_usage", ACTION_CHECKBOX_NAME: [str(hold.pk)]}

    admin_client.post(url, body)
    admin_client.post(url, body)  # already settled: nothing happens, nothing recorded

    [row] = actions("hold.settle")
    assert row.before["state"] == "active" and row.after["state"] == "settled"
    assert row.after["refunded"] == hold.amount and row.job_id == hold.job_ref


def test_clearing_a_quarantine_by_action_or_by_delete_is_recorded(admin_client):
    job = submitted(funded("poison", "paid"))
    url = reverse("admin:jobs_quarantinedfingerprint_changelist")
    for fingerprint in ("ab" * 32, "cd" * 32):
        QuarantinedFingerprint.objects.create(
            fingerprint=fingerprint, reason="hung", node_count=3, sample_job=job
        )

    admin_client.post(url, {"action": "clear_quarantines", ACTION_CHECKBOX_NAME: ["ab" * 32]})
    admin_client.post(
        url, {"action": "delete_selected", ACTION_CHECKBOX_NAME: ["cd" * 32], "post": "yes"}
    )

    assert not QuarantinedFingerprint.objects.exists()
    rows = actions("quarantine.clear")
    assert [row.target_id for row in rows] == ["ab" * 32, "cd" * 32]
    assert all(row.job_id == job.pk and row.before["node_count"] == 3 for row in rows)


def _org_form(org: Org, **changes) -> dict:
    """The org change form as the browser posts it (no budget or project rows)."""
    body = {
        "name": org.name,
        "tier": org.tier,
        "weight": org.weight,
        "dedup_enabled": "",
        "max_queued_jobs": "",
        "max_running_jobs": "",
        "rate_per_s": "",
        "rate_burst": "",
    }
    for prefix in ("budgets", "projects"):
        body.update(
            {
                f"{prefix}-TOTAL_FORMS": 0,
                f"{prefix}-INITIAL_FORMS": 0,
                f"{prefix}-MIN_NUM_FORMS": 0,
                f"{prefix}-MAX_NUM_FORMS": 1000,
            }
        )
    body.update(changes)
    return body


def test_setting_an_orgs_tier_weight_and_quotas_is_recorded_with_before_and_after(admin_client):
    org = funded("tiers", "free")
    url = reverse("admin:accounts_org_change", args=[org.pk])

    response = admin_client.post(
        url, _org_form(org, tier="enterprise", weight=3.5, max_queued_jobs=40, rate_per_s=5.0)
    )

    assert response.status_code == 302
    org.refresh_from_db()
    assert (org.tier, org.weight, org.max_queued_jobs, org.rate_per_s) == (
        "enterprise",
        3.5,
        40,
        5.0,
    )
    [row] = actions("org.update")
    assert row.before == {
        "tier": "free",
        "weight": 1.0,
        "max_queued_jobs": None,
        "rate_per_s": None,
    }
    assert row.after == {
        "tier": "enterprise",
        "weight": 3.5,
        "max_queued_jobs": 40,
        "rate_per_s": 5.0,
    }
    admin_client.post(
        url, _org_form(org, tier="enterprise", weight=3.5, max_queued_jobs=40, rate_per_s=5.0)
    )
    assert len(actions("org.update")) == 1  # saving without a change records nothing


def test_an_org_created_in_the_admin_is_recorded(admin_client):
    form = _org_form(Org(name="brand-new", tier="paid", weight=2.0))
    assert admin_client.post(reverse("admin:accounts_org_add"), form).status_code == 302
    org = Org.objects.get(name="brand-new")
    [row] = actions("org.create")
    assert row.org_id == org.pk and row.after["tier"] == "paid"


def test_budgets_set_in_the_org_page_go_through_the_ledger_and_are_recorded(admin_client):
    org = funded("budgets", "paid")
    project = ProjectFactory(org=org)
    held = submitted(org, project=project).hold.amount
    body = _org_form(
        org,
        **{
            "budgets-TOTAL_FORMS": 2,
            "budgets-0-project": "",
            "budgets-0-user": "",
            "budgets-0-limit": 50 * CREDIT,
            "budgets-0-period": "month",
            "budgets-0-mode": "hard",
            "budgets-1-project": project.pk,
            "budgets-1-user": "",
            "budgets-1-limit": 10 * CREDIT,
            "budgets-1-period": "total",
            "budgets-1-mode": "soft",
        },
    )

    response = admin_client.post(reverse("admin:accounts_org_change", args=[org.pk]), body)

    assert response.status_code == 302
    org_budget = Budget.objects.get(org=org, project=None)
    assert (org_budget.limit, org_budget.held) == (50 * CREDIT, held)  # caches recomputed
    assert Budget.objects.get(org=org, project=project).mode == BudgetMode.SOFT
    rows = actions("budget.set")
    assert len(rows) == 2 and all(row.org_id == org.pk and row.before == {} for row in rows)
    assert {row.after["limit"] for row in rows} == {50 * CREDIT, 10 * CREDIT}


def test_a_budget_changed_in_the_org_page_is_recorded_with_its_old_settings(admin_client):
    org = funded("budget-change", "paid")
    budget = Budget.objects.create(org=org, limit=CREDIT, period="total", mode="hard")
    body = _org_form(
        org,
        **{
            "budgets-TOTAL_FORMS": 1,
            "budgets-INITIAL_FORMS": 1,
            "budgets-0-id": budget.pk,
            "budgets-0-org": org.pk,
            "budgets-0-project": "",
            "budgets-0-user": "",
            "budgets-0-limit": 3 * CREDIT,
            "budgets-0-period": "month",
            "budgets-0-mode": "soft",
        },
    )

    response = admin_client.post(reverse("admin:accounts_org_change", args=[org.pk]), body)

    assert response.status_code == 302
    [row] = actions("budget.set")
    assert row.target_id == str(budget.pk)
    assert row.before == {
        "project": "",
        "user": "",
        "limit": CREDIT,
        "period": "total",
        "mode": "hard",
    }
    assert (row.after["limit"], row.after["period"], row.after["mode"]) == (
        3 * CREDIT,
        "month",
        "soft",
    )


def test_a_budgets_scope_cannot_be_moved_in_the_org_page(admin_client):
    org = funded("scopes", "paid")
    project = ProjectFactory(org=org)
    budget = Budget.objects.create(org=org, limit=CREDIT, period="total", mode="hard")
    body = _org_form(
        org,
        **{
            "budgets-TOTAL_FORMS": 1,
            "budgets-INITIAL_FORMS": 1,
            "budgets-0-id": budget.pk,
            "budgets-0-org": org.pk,
            "budgets-0-project": project.pk,
            "budgets-0-user": "",
            "budgets-0-limit": CREDIT,
            "budgets-0-period": "total",
            "budgets-0-mode": "hard",
        },
    )
    response = admin_client.post(reverse("admin:accounts_org_change", args=[org.pk]), body)
    assert (
        response.status_code == 200 and b"scope (project, user) cannot change" in response.content
    )
    assert not actions("budget.set")


def test_a_budget_changed_in_the_budget_admin_is_recorded_with_its_old_limit(admin_client):
    org = funded("budget-admin", "paid")
    add = reverse("admin:ledger_budget_add")
    admin_client.post(add, {"org": org.pk, "limit": 5 * CREDIT, "period": "month", "mode": "hard"})
    budget = Budget.objects.get(org=org)
    admin_client.post(
        reverse("admin:ledger_budget_change", args=[budget.pk]),
        {"limit": 7 * CREDIT, "period": "month", "mode": "soft"},
    )
    created, changed = actions("budget.set")
    assert created.before == {} and created.after["limit"] == 5 * CREDIT
    assert (changed.before["limit"], changed.after["limit"]) == (5 * CREDIT, 7 * CREDIT)
    assert changed.after["mode"] == "soft" and changed.target_id == str(budget.pk)


def test_revoking_keys_and_changing_a_price_are_recorded(admin_client):
    org = funded("keys", "paid")
    from apps.accounts.services import issue_api_key

    key = issue_api_key(org=org).api_key
    admin_client.post(
        reverse("admin:accounts_apikey_changelist"),
        {"action": "revoke", ACTION_CHECKBOX_NAME: [str(key.pk)]},
    )
    admin_client.post(
        reverse("admin:fleet_gputype_change", args=["H100"]),
        {"name": "H100", "memory_gb": 80, "price_per_gpu_hour": 4_500_000},
    )

    assert APIKey.objects.get(pk=key.pk).revoked_at is not None
    [revoke] = actions("apikey.revoke")
    assert revoke.org_id == org.pk and revoke.after["revoked_at"]
    [price] = actions("gpu_type.update")
    assert price.before["price_per_gpu_hour"] == 4_000_000
    assert price.after["price_per_gpu_hour"] == 4_500_000
    assert GpuType.objects.get(pk="H100").price_per_gpu_hour == 4_500_000


def test_operator_actions_are_append_only_in_the_database(admin_client):
    NodeFactory(gpus=1)
    admin_client.post(NODES, {"action": "drain", ACTION_CHECKBOX_NAME: [Node.objects.get().pk]})
    row = OperatorAction.objects.get()
    for attempt in (
        lambda: OperatorAction.objects.filter(pk=row.pk).update(actor="someone else"),
        lambda: OperatorAction.objects.filter(pk=row.pk).delete(),
    ):
        with pytest.raises((InternalError, IntegrityError)), transaction.atomic():
            attempt()
    assert OperatorAction.objects.get().actor == "operator:admin"
    page = admin_client.get(reverse("admin:accounts_operatoraction_change", args=[row.pk]))
    assert page.status_code == 200 and b'name="_save"' not in page.content


def test_the_audit_trail_page_merges_sources_and_filters_by_org_job_and_kind(admin_client):
    world = platform()
    url = reverse("admin:audit_trail")

    everything = admin_client.get(url).content.decode()
    for source in ("operator", "dispatch", "job", "ledger"):
        assert f'class="audit-{source}"' in everything
    mine = admin_client.get(url, {"job": str(world.running.pk)}).content.decode()
    assert "job.running" in mine and "dispatch.place" in mine and "dispatch.preempt" in mine
    assert "a quiet harbour" not in mine
    free_only = admin_client.get(url, {"org": world.free.pk}).context["rows"]
    assert free_only and {row["org_name"] for row in free_only} == {world.free.name}
    preemptions = admin_client.get(url, {"kind": "dispatch.preempt"}).content.decode()
    assert preemptions.count('class="audit-dispatch"') == 1
    assert "waited past the tier" in preemptions


def test_the_audit_trail_page_pages_with_an_older_link_and_shows_bad_filters(admin_client):
    platform()
    url = reverse("admin:audit_trail")
    first = admin_client.get(url, {"limit": 3})
    rows = first.context["rows"]
    assert len(rows) == 3 and first.context["next_cursor"]
    second = admin_client.get(url, {"limit": 3, "cursor": first.context["next_cursor"]})
    assert {r["item"].id for r in second.context["rows"]}.isdisjoint({r["item"].id for r in rows})
    later = (timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")  # datetime-local
    assert admin_client.get(url, {"since": later}).context["rows"] == []
    assert len(admin_client.get(url, {"until": later, "limit": 3}).context["rows"]) == 3
    bad = admin_client.get(url, {"since": "yesterday-ish"})
    assert bad.status_code == 200 and "since" in bad.context["form"].errors
    assert admin_client.get(url, {"cursor": "nonsense"}).context["form"].errors["cursor"]


def test_job_and_org_pages_link_to_their_audit_trail(admin_client):
    world = platform()
    job_page = admin_client.get(reverse("admin:jobs_job_change", args=[world.running.pk]))
    assert f"{reverse('admin:audit_trail')}?job={world.running.pk}" in job_page.content.decode()
    org_page = admin_client.get(reverse("admin:accounts_org_change", args=[world.paid.pk]))
    assert f"{reverse('admin:audit_trail')}?org={world.paid.pk}" in org_page.content.decode()


def test_projects_and_users_created_in_the_admin_are_recorded(admin_client):
    org = funded("people", "paid")

    added = admin_client.post(
        reverse("admin:accounts_project_add"), {"org": org.pk, "name": "render"}
    )
    from_org_page = admin_client.post(
        reverse("admin:accounts_org_change", args=[org.pk]),
        _org_form(org, **{"projects-TOTAL_FORMS": 1, "projects-0-name": "train"}),
    )
    user_added = admin_client.post(
        reverse("admin:accounts_user_add"), {"org": org.pk, "name": "ada", "weight": 2.0}
    )

    assert (added.status_code, from_org_page.status_code, user_added.status_code) == (302,) * 3
    assert set(org.projects.values_list("name", flat=True)) >= {"render", "train"}
    assert {row.after["name"] for row in actions("project.create")} == {"render", "train"}
    assert all(row.org_id == org.pk for row in actions("project.create"))
    [user_row] = actions("user.create")
    assert user_row.after == {"name": "ada", "weight": 2.0}


def test_a_users_weight_changed_in_the_admin_is_recorded_and_its_name_stays(admin_client):
    org = funded("weights", "paid")
    tenant = TenantUser.objects.create(org=org, name="grace", weight=1.0)
    url = reverse("admin:accounts_user_change", args=[tenant.pk])

    response = admin_client.post(url, {"weight": 3.0, "name": "renamed"})
    admin_client.post(url, {"weight": 3.0})  # the same weight again: nothing to record

    assert response.status_code == 302
    tenant.refresh_from_db()
    assert (tenant.name, tenant.weight) == ("grace", 3.0)
    [row] = actions("user.update")
    assert (row.before, row.after) == ({"weight": 1.0}, {"weight": 3.0})


def test_the_org_list_says_who_is_spending_what_in_credits_and_sorts_by_it(admin_client):
    world = platform()  # acme-video: a job running for a minute on 2 GPUs, one queued job
    attempt = Attempt.objects.get(job=world.running)
    Attempt.objects.filter(pk=attempt.pk).update(gpu_ms=120_000, charged=2_500_000)
    orgs = reverse("admin:accounts_org_changelist")
    page = admin_client.get(orgs).content.decode()
    headers = ("available (credits)", "spent 24 h (credits)", "gpu-hours 30 d", "running", "queued")
    for header in headers:
        assert header in page.lower(), header
    row = page[page.index(world.paid.name) :].split("</tr>", 1)[0]
    assert ">2.5<" in row  # spent 24 h and 30 d, in credits, not micro-credits
    assert ">0.03<" in row  # 120 GPU-seconds
    assert f"org__id__exact={world.paid.pk}&status__exact=running" in row.replace("&amp;", "&")
    for column in range(1, 10):  # every column sorts, both ways
        for order in (str(column), f"-{column}"):
            assert admin_client.get(orgs, {"o": order}).status_code == 200


def test_admin_times_are_shown_to_the_second(admin_client):
    world = platform()
    page = admin_client.get(reverse("admin:jobs_job_changelist")).content.decode()
    created = timezone.localtime(world.running.created_at).strftime("%Y-%m-%d %H:%M:%S")
    assert created in page


def test_the_job_list_shows_node_cost_exit_class_and_error(admin_client):
    world = platform()
    Attempt.objects.filter(job=world.running).update(charged=1_250_000)
    failed = JobFactory(org=world.paid, status=JobStatus.FAILED, error_code="crashed")
    jobs = reverse("admin:jobs_job_changelist")
    page = admin_client.get(jobs).content.decode()
    row = page[page.index(str(world.running.pk)) :].split("</tr>", 1)[0]
    assert world.busy_node.name in row and ">1.25<" in row
    failed_row = page[page.index(str(failed.pk)) :].split("</tr>", 1)[0]
    assert "crashed" in failed_row
    for column in range(1, 16):
        assert admin_client.get(jobs, {"o": str(column)}).status_code == 200


def test_the_fleet_page_shows_worker_liveness_queue_waits_in_seconds_and_reasons(admin_client):
    world = platform()
    liveness.publish_pulse([world.busy_node.name], worker="pool@busy-host")
    queue_state.publish(
        [
            (
                str(world.waiting.pk),
                QueueState(
                    position=1,
                    reason="public",
                    estimated_start_at=None,
                    detail="waiting for 2 H100: 0 of 2 free",
                ),
            )
        ]
    )
    page = admin_client.get(reverse("admin:fleet")).content.decode()
    assert "worker pool@busy-host" in page and "no worker seen" in page  # the idle node
    assert "no telemetry" in page
    assert re.search(r"oldest waits \d+ s", page)
    assert "waiting for 2 H100: 0 of 2 free" in page


def test_a_large_fleet_is_shown_a_page_of_nodes_at_a_time_with_the_busy_ones_and_a_search(
    admin_client,
):
    world = platform()
    for n in range(60):
        NodeFactory(name=f"rack-{n:02d}", gpus=2)
    fleet = reverse("admin:fleet")

    def listed(**query):
        response = admin_client.get(fleet, query)
        assert response.status_code == 200
        return re.findall(r'id="node-([^"]+)"', response.content.decode()), response

    first, response = listed()
    total = Node.objects.count()
    assert len(first) == 50 and first == sorted(first)
    assert f"{total} nodes shown, 1–50 on this page" in response.content.decode()
    rest, _ = listed(page=2)
    assert len(rest) == total - 50 and not set(rest) & set(first)
    # The cards count the whole fleet, not the page.
    assert f"{Node.objects.count()}</div>" in response.content.decode()

    assert listed(busy="1")[0] == [world.busy_node.name]
    assert listed(q="RACK-5")[0] == [f"rack-{n}" for n in range(50, 60)]
    assert listed(q="rack", page=2)[0] == [f"rack-{n}" for n in range(50, 60)]
    assert "?q=rack&amp;page=2" in listed(q="rack")[1].content.decode()  # pages keep the search
    assert listed(q="no such node")[0] == []
    assert listed(page="nonsense")[0] == first  # a bad page number shows the first
