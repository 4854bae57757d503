import pytest

from apps.accounts.models import APIKey, OperatorAction
from apps.accounts.services import digest_key, issue_api_key
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_key_is_stored_only_as_digest_and_short_prefix(org):
    issued = issue_api_key(org=org)
    stored = APIKey.objects.get(pk=issued.api_key.pk)
    assert issued.raw_key.startswith(stored.prefix)
    assert len(stored.prefix) < 16
    assert stored.digest == digest_key(issued.raw_key)
    assert issued.raw_key not in {stored.digest, stored.prefix, stored.name}


def test_operator_creates_key_shown_once(operator, org):
    response = operator.post("/v1/api-keys", {"org": str(org.id)}, format="json")
    assert response.status_code == 201
    raw = response.json()["key"]
    listed = operator.get("/v1/api-keys").json()["results"]
    assert all("key" not in row for row in listed)
    assert client_with(raw).get(f"/v1/orgs/{org.id}").status_code == 200


def test_key_scoped_to_project_and_user_of_its_org(operator, org):
    project, user = ProjectFactory(org=org), UserFactory(org=org)
    body = {"org": str(org.id), "project": str(project.id), "user": str(user.id)}
    response = operator.post("/v1/api-keys", body, format="json")
    assert response.status_code == 201
    assert response.json()["project"] == str(project.id)
    assert response.json()["user"] == str(user.id)


def test_key_for_another_orgs_project_is_refused_naming_the_field(operator, org):
    foreign = ProjectFactory(org=OrgFactory())
    response = operator.post(
        "/v1/api-keys", {"org": str(org.id), "project": str(foreign.id)}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "project"
    assert APIKey.objects.filter(project=foreign).count() == 0


def test_revoked_key_is_401(operator, org):
    issued = issue_api_key(org=org)
    assert operator.delete(f"/v1/api-keys/{issued.api_key.id}").status_code == 200
    response = client_with(issued.raw_key).get(f"/v1/orgs/{org.id}")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"


@pytest.mark.parametrize(
    "header",
    ["", "Bearer", "Bearer gk_nope_nope", "Token abc", "Bearer a b", "Basic dXNlcjpwYXNz"],
)
def test_missing_or_invalid_key_is_401(anonymous, org, header):
    if header:
        anonymous.credentials(HTTP_AUTHORIZATION=header)
    response = anonymous.get(f"/v1/orgs/{org.id}")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "unauthenticated"


def test_create_operator_key_command_prints_key_on_last_line(capsys):
    from django.core.management import call_command

    call_command("create_operator_key", "--name", "ci")
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert client_with(last_line).get("/v1/orgs").status_code == 200
    key = APIKey.objects.get(digest=digest_key(last_line))
    assert key.is_operator
    [row] = OperatorAction.objects.filter(action="apikey.create", target_id=key.prefix)
    assert row.actor.startswith("cli:") and row.after["is_operator"] is True
