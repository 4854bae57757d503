"""The operator REST API leaves the same audit trail as the admin: every state-changing
call is an operator action on GET /v1/audit under the admin's name for it, with the
calling key as actor (`api:<key prefix>`), its target and parameters, written in the
change's transaction. A refused call (an error answer) records nothing."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts import operator_actions
from apps.accounts.models import APIKey, OperatorAction, Org, Project, User
from apps.accounts.services import issue_api_key
from apps.fleet.models import Node, NodeState
from apps.jobs.models import JobStatus
from apps.ledger import services as ledger
from apps.ledger.models import Bucket, Budget, Entry
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, UserFactory, org_key
from tests.jobs.factories import JobFactory, place, reset_job_state
from tests.ops.audit_world import CREDIT
from tests.scheduler.factories import NodeFactory, unique_name

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_state(db):
    reset_job_state()  # the demo GPU types, empty rate-limit buckets


@dataclass
class OperatorAPI:
    """A client holding an operator key, and the actor its calls are recorded as."""

    client: object
    actor: str


@pytest.fixture
def operator_api(db) -> OperatorAPI:
    issued = issue_api_key(operator=True, name="ops-console")
    return OperatorAPI(client_with(issued.raw_key), f"api:{issued.api_key.prefix}")


def operator_rows(client, **params) -> list[dict]:
    """The operator actions on the audit trail (GET /v1/audit), oldest first."""
    response = client.get("/v1/audit", {"kind": "operator", "limit": 200, **params})
    assert response.status_code == 200, response.json()
    return response.json()["results"][::-1]


def test_bootstrapping_a_tenant_records_every_step_with_the_key_as_actor(operator_api):
    api = operator_api.client
    org = api.post("/v1/orgs", {"name": "acme", "tier": "paid"}, format="json").json()
    changed = api.patch(
        f"/v1/orgs/{org['id']}", {"tier": "enterprise", "weight": 2.5, "name": "acme"}, "json"
    )
    project = api.post(f"/v1/orgs/{org['id']}/projects", {"name": "video"}, "json").json()
    user = api.post(f"/v1/orgs/{org['id']}/users", {"name": "ana", "weight": 2}, "json").json()
    key = api.post(
        "/v1/api-keys", {"org": org["id"], "project": project["id"], "name": "ci"}, "json"
    ).json()
    revoked = api.delete(f"/v1/api-keys/{key['id']}")

    assert changed.status_code == revoked.status_code == 200
    rows = operator_rows(api, org=org["id"])
    assert [(row["kind"], row["actor"], row["org"]) for row in rows] == [
        (kind, operator_api.actor, org["id"])
        for kind in (
            "operator.org.create",
            "operator.org.update",
            "operator.project.create",
            "operator.user.create",
            "operator.apikey.create",
            "operator.apikey.revoke",
        )
    ]
    created, update, new_project, new_user, issued, revoke = (row["data"] for row in rows)
    assert created["target_id"] == org["id"] and created["after"]["tier"] == "paid"
    # Only what changed (the name did not), before and after.
    assert (update["before"], update["after"]) == (
        {"tier": "paid", "weight": 1.0},
        {"tier": "enterprise", "weight": 2.5},
    )
    assert (new_project["target_id"], new_project["after"]) == (project["id"], {"name": "video"})
    assert (new_user["target_id"], new_user["after"]) == (user["id"], {"name": "ana", "weight": 2})
    assert issued["target_id"] == key["prefix"] == revoke["target_id"]
    assert issued["after"]["project"] == project["id"] and issued["after"]["name"] == "ci"
    assert revoke["before"] == {"revoked_at": None} and revoke["after"]["revoked_at"]
    assert key["key"] not in json.dumps(rows)  # the secret itself is never recorded


def test_an_operator_key_minted_through_the_api_is_recorded_without_an_org(operator_api):
    minted = operator_api.client.post("/v1/api-keys", {"operator": True, "name": "ci-ops"}, "json")

    assert minted.status_code == 201
    [row] = operator_rows(operator_api.client, kind="operator.apikey.create")
    assert (row["kind"], row["org"], row["data"]["target_id"]) == (
        "operator.apikey.create",
        None,
        minted.json()["prefix"],
    )
    assert row["data"]["after"]["is_operator"] is True


def test_grants_and_budgets_are_recorded_with_their_parameters(operator_api):
    api = operator_api.client
    org = OrgFactory()
    project, user = ProjectFactory(org=org), UserFactory(org=org)
    expires = (timezone.now() + timedelta(days=30)).replace(microsecond=0)
    grant = api.post(
        "/v1/credits/grants",
        {
            "org": str(org.pk),
            "project": str(project.pk),
            "amount": 5 * CREDIT,
            "kind": "promo",
            "expires_at": expires.isoformat(),
        },
        "json",
        HTTP_IDEMPOTENCY_KEY="grant-1",
    )
    budget = {"org": str(org.pk), "period": "month"}
    first = api.put("/v1/budgets", {**budget, "limit": 10 * CREDIT, "mode": "hard"}, "json")
    api.put("/v1/budgets", {**budget, "limit": 20 * CREDIT, "mode": "soft"}, "json")
    scoped = {**budget, "project": str(project.pk), "user": str(user.pk), "mode": "hard"}
    api.put("/v1/budgets", {**scoped, "limit": CREDIT}, "json")

    assert grant.status_code == 201
    rows = operator_rows(api, org=str(org.pk))
    assert [row["kind"] for row in rows] == ["operator.credits.grant", *["operator.budget.set"] * 3]
    assert {row["actor"] for row in rows} == {operator_api.actor}
    granted = rows[0]["data"]
    assert granted["target_id"] == grant.json()["id"]
    assert granted["after"] == {
        "kind": "promo",
        "amount": 5 * CREDIT,
        "project": str(project.pk),
        "expires_at": expires.isoformat().replace("+00:00", "Z"),
    }
    created, changed, narrow = (row["data"] for row in rows[1:])
    org_wide = {"project": "", "user": "", "period": "month"}
    assert (created["before"], created["after"]) == (
        {},
        {**org_wide, "limit": 10 * CREDIT, "mode": "hard"},
    )
    assert (changed["before"], changed["after"]) == (
        created["after"],
        {**org_wide, "limit": 20 * CREDIT, "mode": "soft"},
    )
    assert created["target_id"] == changed["target_id"] == first.json()["id"]
    assert narrow["before"] == {} and narrow["after"]["user"] == str(user.pk)
    # The grant's ledger entry names the same actor as its audit row.
    issue = operator_rows(api, org=str(org.pk), kind="ledger.issue")
    assert [row["reason"] for row in issue] == [f"promo grant by {operator_api.actor}"]


def test_a_grant_retried_with_its_idempotency_key_is_one_bucket_and_one_row(operator_api):
    org = OrgFactory()
    body = {"org": str(org.pk), "amount": CREDIT, "kind": "paid"}

    for _ in range(2):
        response = operator_api.client.post(
            "/v1/credits/grants", body, "json", HTTP_IDEMPOTENCY_KEY="retry-me"
        )
        assert response.status_code == 201

    assert Bucket.objects.filter(org=org).count() == 1
    assert [row["kind"] for row in operator_rows(operator_api.client)] == ["operator.credits.grant"]


def test_fleet_changes_are_recorded_as_the_admins_node_actions(operator_api):
    api = operator_api.client
    name = unique_name("api")

    added = api.post(
        "/v1/fleet/nodes",
        {"name": name, "gpus": [{"type": "H100", "device": "0"}, {"type": "A100"}]},
        "json",
    )
    api.post(f"/v1/fleet/nodes/{name}/drain")
    api.post(f"/v1/fleet/nodes/{name}/undrain")
    removed = api.delete(f"/v1/fleet/nodes/{name}")

    assert (added.status_code, removed.status_code) == (201, 204)
    rows = operator_rows(api)
    assert {(row["actor"], row["data"]["target_id"]) for row in rows} == {
        (operator_api.actor, name)
    }
    assert [(row["kind"], row["data"]["before"], row["data"]["after"]) for row in rows] == [
        (
            "operator.node.add",
            {},
            {
                "name": name,
                "state": "active",
                "gpus": [
                    {"index": 0, "type": "H100", "device": "0"},
                    {"index": 1, "type": "A100", "device": ""},
                ],
            },
        ),
        ("operator.node.drain", {"state": "active"}, {"state": "draining"}),
        ("operator.node.undrain", {"state": "draining"}, {"state": "active"}),
        ("operator.node.remove", {"state": "active"}, {"state": "deleted"}),
    ]


def test_changes_that_change_nothing_record_nothing_more(operator_api):
    api = operator_api.client
    org = OrgFactory(tier="paid")
    key = issue_api_key(org=org).api_key

    for _ in range(2):
        assert api.patch(f"/v1/orgs/{org.pk}", {"tier": "enterprise"}, "json").status_code == 200
        assert api.delete(f"/v1/api-keys/{key.pk}").status_code == 200

    kinds = [row["kind"] for row in operator_rows(api, org=str(org.pk))]
    assert kinds == ["operator.org.update", "operator.apikey.revoke"]


@dataclass
class World:
    """What the refused calls below run into."""

    org: Org
    other: Org
    foreign_user: User
    busy: Node
    removed: Node

    def names(self) -> dict:
        return {
            "org": self.org.pk,
            "org_name": self.org.name,
            "other_name": self.other.name,
            "foreign_user": self.foreign_user.pk,
            "busy": self.busy.name,
            "removed": self.removed.name,
            "unknown": uuid.uuid4(),
        }


@pytest.fixture
def world(db) -> World:
    org, other = OrgFactory(), OrgFactory()
    ProjectFactory(org=org, name="video")
    ledger.grant(org=org, amount=CREDIT, kind="paid", idempotency_key="used", actor="test")
    busy = place(JobFactory(org=org, status=JobStatus.SCHEDULED)).node  # a GPU held
    removed = NodeFactory(state=NodeState.DOWN)
    return World(org, other, UserFactory(org=other), busy, removed)


OPERATOR, TENANT = "operator", "tenant"
REFUSED = [
    # (who, method, path, body, Idempotency-Key, status)
    (OPERATOR, "post", "/v1/orgs", {"tier": "free"}, None, 400),
    (OPERATOR, "post", "/v1/orgs", {"name": "{org_name}", "tier": "free"}, None, 409),
    (TENANT, "post", "/v1/orgs", {"name": "mine", "tier": "enterprise"}, None, 403),
    (OPERATOR, "patch", "/v1/orgs/{org}", {"tier": "gold"}, None, 400),
    (OPERATOR, "patch", "/v1/orgs/{org}", {"name": "{other_name}"}, None, 409),
    (OPERATOR, "patch", "/v1/orgs/{unknown}", {"tier": "free"}, None, 404),
    (OPERATOR, "post", "/v1/orgs/{org}/projects", {"name": ""}, None, 400),
    (OPERATOR, "post", "/v1/orgs/{org}/projects", {"name": "video"}, None, 409),
    (OPERATOR, "post", "/v1/orgs/{unknown}/users", {"name": "ana"}, None, 404),
    (OPERATOR, "post", "/v1/api-keys", {"org": "{unknown}"}, None, 400),
    (OPERATOR, "post", "/v1/api-keys", {"org": "{org}", "operator": True}, None, 400),
    (OPERATOR, "delete", "/v1/api-keys/{unknown}", None, None, 404),
    (
        OPERATOR,
        "post",
        "/v1/credits/grants",
        {"org": "{org}", "amount": -5, "kind": "paid"},
        "k",
        400,
    ),
    (
        OPERATOR,
        "post",
        "/v1/credits/grants",
        {"org": "{org}", "amount": 5, "kind": "paid", "expires_at": "2001-01-01T00:00:00Z"},
        "k",
        400,
    ),
    (
        OPERATOR,
        "post",
        "/v1/credits/grants",
        {"org": "{org}", "amount": 7, "kind": "paid"},
        "used",
        409,
    ),
    (
        OPERATOR,
        "post",
        "/v1/credits/grants",
        {"org": "{org}", "amount": 7, "kind": "paid"},
        None,
        400,
    ),
    (TENANT, "post", "/v1/credits/grants", {"org": "{org}", "amount": 7, "kind": "paid"}, "k", 403),
    (
        OPERATOR,
        "put",
        "/v1/budgets",
        {"org": "{org}", "limit": 1, "period": "week", "mode": "hard"},
        None,
        400,
    ),
    (
        OPERATOR,
        "put",
        "/v1/budgets",
        {"org": "{org}", "user": "{foreign_user}", "limit": 1, "period": "total", "mode": "hard"},
        None,
        400,
    ),
    (OPERATOR, "post", "/v1/fleet/nodes", {"name": "n-1", "gpus": [{"type": "TPU"}]}, None, 400),
    (
        OPERATOR,
        "post",
        "/v1/fleet/nodes",
        {"name": "{busy}", "gpus": [{"type": "H100"}]},
        None,
        409,
    ),
    (OPERATOR, "post", "/v1/fleet/nodes/nowhere/drain", None, None, 404),
    (OPERATOR, "post", "/v1/fleet/nodes/{removed}/drain", None, None, 409),
    (OPERATOR, "post", "/v1/fleet/nodes/nowhere/undrain", None, None, 404),
    (OPERATOR, "delete", "/v1/fleet/nodes/{busy}", None, None, 409),
    (TENANT, "delete", "/v1/fleet/nodes/{removed}", None, None, 403),
]


def filled(value, names: dict):
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, dict):
        return {key: filled(item, names) for key, item in value.items()}
    return value


def footprint() -> dict:
    """What an operator call could have changed."""
    return {
        "orgs": list(Org.objects.order_by("pk").values_list("pk", "name", "tier", "weight")),
        "projects": Project.objects.count(),
        "users": User.objects.count(),
        "keys": list(APIKey.objects.order_by("pk").values_list("pk", "revoked_at")),
        "buckets": Bucket.objects.count(),
        "entries": Entry.objects.count(),
        "budgets": Budget.objects.count(),
        "nodes": list(Node.objects.order_by("pk").values_list("name", "state")),
    }


@pytest.mark.parametrize(("who", "method", "path", "body", "key", "status"), REFUSED)
def test_a_refused_call_records_nothing_and_changes_nothing(
    operator_api, world, who, method, path, body, key, status
):
    names = world.names()
    caller = operator_api.client if who == OPERATOR else client_with(org_key(world.org))
    before = footprint()
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}

    response = getattr(caller, method)(
        filled(path, names), filled(body, names), format="json", **headers
    )

    assert response.status_code == status, response.content
    assert response.json()["error"]["code"]
    assert operator_rows(operator_api.client) == []
    assert not OperatorAction.objects.exists()
    assert footprint() == before


def test_a_grant_whose_audit_row_cannot_be_written_does_not_happen(operator_api, monkeypatch):
    """The change and its row commit together: no row, no credit."""
    org = OrgFactory()

    def refuse(**row):
        raise RuntimeError("audit store unavailable")

    monkeypatch.setattr(operator_actions, "record_operator_action", refuse)
    with pytest.raises(RuntimeError, match="audit store unavailable"):
        operator_api.client.post(
            "/v1/credits/grants",
            {"org": str(org.pk), "amount": CREDIT, "kind": "paid"},
            "json",
            HTTP_IDEMPOTENCY_KEY="lost",
        )
    monkeypatch.undo()

    assert not Bucket.objects.filter(org=org).exists()
    assert not Entry.objects.filter(org=org).exists()
    retried = operator_api.client.post(
        "/v1/credits/grants",
        {"org": str(org.pk), "amount": CREDIT, "kind": "paid"},
        "json",
        HTTP_IDEMPOTENCY_KEY="lost",
    )
    assert retried.status_code == 201  # nothing half-done blocks the retry
    assert [row["kind"] for row in operator_rows(operator_api.client)] == ["operator.credits.grant"]
