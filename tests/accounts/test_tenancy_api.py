import base64

import pytest

from apps.accounts.models import Org, Project
from apps.core.models import IdempotentRequest
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, UserFactory, org_key

pytestmark = pytest.mark.django_db


def test_operator_bootstraps_org_project_and_org_key(operator):
    org = operator.post(
        "/v1/orgs", {"name": "acme", "tier": "enterprise", "weight": 3}, format="json"
    )
    assert org.status_code == 201, org.content
    org_id = org.json()["id"]
    assert org.json()["tier"] == "enterprise" and org.json()["weight"] == 3
    project = operator.post(f"/v1/orgs/{org_id}/projects", {"name": "video"}, format="json")
    assert project.status_code == 201
    user = operator.post(f"/v1/orgs/{org_id}/users", {"name": "ana"}, format="json")
    assert user.status_code == 201
    key = operator.post("/v1/api-keys", {"org": org_id}, format="json")
    assert key.status_code == 201
    tenant = client_with(key.json()["key"])
    projects = tenant.get(f"/v1/orgs/{org_id}/projects").json()["results"]
    assert [p["name"] for p in projects] == ["video"]


def test_org_key_gets_404_for_every_object_of_another_org(tenant, org):
    other = OrgFactory()
    ProjectFactory(org=other)
    UserFactory(org=other)
    for path in (
        f"/v1/orgs/{other.id}",
        f"/v1/orgs/{other.id}/projects",
        f"/v1/orgs/{other.id}/users",
    ):
        response = tenant.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
    assert [o["id"] for o in tenant.get("/v1/orgs").json()["results"]] == [str(org.id)]
    other_key_ids = {str(k.id) for k in other.api_keys.all()}
    org_key(other)
    listed = {k["id"] for k in tenant.get("/v1/api-keys").json()["results"]}
    assert not listed & other_key_ids
    assert all(k["org"] == str(org.id) for k in tenant.get("/v1/api-keys").json()["results"])


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/orgs", {"name": "x", "tier": "free"}),
        ("post", "/v1/api-keys", {"operator": True}),
        ("post", "/v1/orgs/{org}/projects", {"name": "p"}),
        ("post", "/v1/orgs/{org}/users", {"name": "u"}),
        ("patch", "/v1/orgs/{org}", {"tier": "enterprise"}),
    ],
)
def test_operator_only_endpoints_refuse_org_keys_with_403(tenant, org, method, path, body):
    response = getattr(tenant, method)(path.format(org=org.id), body, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    org.refresh_from_db()
    assert org.tier == "paid"
    assert Org.objects.filter(name="x").count() == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tier": "free"}, "name"),
        ({"name": "a", "tier": "gold"}, "tier"),
        ({"name": "a", "tier": "free", "weight": -1}, "weight"),
        ({"name": "a", "tier": "free", "weight": "heavy"}, "weight"),
        ({"name": "", "tier": "free"}, "name"),
        ({"name": "a" * 300, "tier": "free"}, "name"),
    ],
)
def test_bad_org_body_is_400_naming_the_field(operator, body, field):
    response = operator.post("/v1/orgs", body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == field and field in error["message"]


def test_malformed_json_is_400_not_500(operator):
    response = operator.post("/v1/orgs", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed"


def test_non_object_json_body_is_400(operator):
    response = operator.post("/v1/orgs", [1, 2], format="json")
    assert response.status_code == 400


def test_duplicate_org_name_is_409(operator):
    operator.post("/v1/orgs", {"name": "dup", "tier": "free"}, format="json")
    response = operator.post("/v1/orgs", {"name": "dup", "tier": "free"}, format="json")
    assert response.status_code == 409
    assert Org.objects.filter(name="dup").count() == 1


def test_duplicate_project_name_in_org_is_409(operator, org):
    ProjectFactory(org=org, name="p")
    response = operator.post(f"/v1/orgs/{org.id}/projects", {"name": "p"}, format="json")
    assert response.status_code == 409
    assert Project.objects.filter(org=org, name="p").count() == 1


def test_unknown_org_id_in_key_body_is_400(operator):
    response = operator.post(
        "/v1/api-keys", {"org": "00000000-0000-0000-0000-000000000000"}, format="json"
    )
    assert response.status_code == 400 and response.json()["error"]["field"] == "org"


def test_operator_key_needs_no_org_and_org_key_needs_one(operator, org):
    assert operator.post("/v1/api-keys", {"operator": True}, format="json").status_code == 201
    response = operator.post("/v1/api-keys", {}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == "org"
    response = operator.post("/v1/api-keys", {"operator": True, "org": str(org.id)}, format="json")
    assert response.status_code == 400


def test_same_idempotency_key_replays_and_different_body_conflicts(operator):
    headers = {"HTTP_IDEMPOTENCY_KEY": "create-acme"}
    first = operator.post("/v1/orgs", {"name": "acme", "tier": "paid"}, format="json", **headers)
    again = operator.post("/v1/orgs", {"name": "acme", "tier": "paid"}, format="json", **headers)
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    other = operator.post("/v1/orgs", {"name": "acme2", "tier": "paid"}, format="json", **headers)
    assert other.status_code == 409
    assert Org.objects.filter(name__startswith="acme").count() == 1


def test_cursor_pagination_walks_every_org_once(operator):
    for i in range(7):
        OrgFactory(name=f"page-{i}")
    seen, cursor = [], None
    while True:
        url = "/v1/orgs?limit=3" + (f"&cursor={cursor}" if cursor else "")
        body = operator.get(url).json()
        seen += [o["name"] for o in body["results"]]
        cursor = body["next"]
        if not cursor:
            break
    assert sorted(n for n in seen if n.startswith("page-")) == [f"page-{i}" for i in range(7)]
    assert len(seen) == len(set(seen))


def test_tampered_cursor_is_400_naming_cursor(operator):
    tampered = base64.b64encode(b"o=not-a-number").decode()
    response = operator.get(f"/v1/orgs?cursor={tampered}")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "cursor"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/orgs/{org}/projects", {"name": "video"}),
        ("/v1/orgs/{org}/users", {"name": "alice"}),
        ("/v1/api-keys", {"org": "{org}"}),
        ("/v1/orgs", {"name": "acme-2", "tier": "paid"}),
    ],
)
def test_every_operator_create_replays_under_its_idempotency_key(operator, org, path, body):
    body = {k: v.format(org=org.id) for k, v in body.items()}
    url = path.format(org=org.id)
    first = operator.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    assert first.status_code == 201, first.content
    again = operator.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="create-1")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    if "key" in first.json():  # a new API key is shown once: never stored, never replayed
        assert first.json()["key"] and again.json()["key"] is None
        assert first.json()["key"] not in str(IdempotentRequest.objects.values_list())
