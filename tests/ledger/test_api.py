"""The credit endpoints of the public API (docs/api.md): balance, entries, grants, budgets."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.ledger import services
from apps.ledger.models import Bucket, Budget
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, UserFactory, org_key
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db

GRANT = "/v1/credits/grants"


def grant_body(owner, **changes):
    return {"org": str(owner.id), "amount": 5 * CREDIT, "kind": "paid", **changes}


# --- POST /v1/credits/grants ------------------------------------------------------------


def test_operator_grants_credit_and_gets_the_bucket(operator, org):
    expires = (timezone.now() + timedelta(days=30)).isoformat()
    response = operator.post(
        GRANT,
        grant_body(org, kind="promo", expires_at=expires),
        format="json",
        HTTP_IDEMPOTENCY_KEY="g-1",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert {"id", "kind", "amount", "remaining", "expires_at"} <= set(body)
    assert (body["kind"], body["amount"], body["remaining"]) == ("promo", 5 * CREDIT, 5 * CREDIT)
    bucket = Bucket.objects.get(pk=body["id"])
    assert bucket.org == org and bucket.idempotency_key == "g-1"
    assert bucket.actor.startswith("api:gk_")  # the same actor as its audit row


def test_a_grant_replayed_with_the_same_key_answers_the_first_bucket_once(operator, org):
    first = operator.post(GRANT, grant_body(org), format="json", HTTP_IDEMPOTENCY_KEY="g-1")
    again = operator.post(GRANT, grant_body(org), format="json", HTTP_IDEMPOTENCY_KEY="g-1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert Bucket.objects.filter(org=org).count() == 1
    other = operator.post(
        GRANT, grant_body(org, amount=7), format="json", HTTP_IDEMPOTENCY_KEY="g-1"
    )
    assert other.status_code == 409


def test_a_grant_needs_an_idempotency_key(operator, org):
    response = operator.post(GRANT, grant_body(org), format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "Idempotency-Key"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"amount": 0}, "amount"),
        ({"amount": "lots"}, "amount"),
        ({"amount": None}, "amount"),
        ({"kind": "gift"}, "kind"),
        ({"org": "not-a-uuid"}, "org"),
        ({"org": "00000000-0000-0000-0000-000000000000"}, "org"),
        ({"project": "00000000-0000-0000-0000-000000000000"}, "project"),
        ({"expires_at": "yesterday"}, "expires_at"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
    ],
)
def test_a_bad_grant_body_is_400_naming_the_field(operator, org, changes, field):
    response = operator.post(
        GRANT, grant_body(org, **changes), format="json", HTTP_IDEMPOTENCY_KEY=f"bad-{field}"
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert not Bucket.objects.filter(org=org).exists()


def test_a_grant_into_another_orgs_project_is_400(operator, org):
    response = operator.post(
        GRANT,
        grant_body(org, project=str(ProjectFactory().id)),
        format="json",
        HTTP_IDEMPOTENCY_KEY="x",
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "project"


def test_an_org_key_cannot_grant_credit(tenant, org):
    response = tenant.post(GRANT, grant_body(org), format="json", HTTP_IDEMPOTENCY_KEY="self")
    assert response.status_code == 403
    assert not Bucket.objects.filter(org=org).exists()


def test_credit_endpoints_need_a_key(anonymous):
    assert anonymous.get("/v1/balance").status_code == 401
    assert anonymous.get("/v1/ledger/entries").status_code == 401
    assert anonymous.post(GRANT, {}, format="json").status_code == 401
    assert anonymous.put("/v1/budgets", {}, format="json").status_code == 401


# --- PUT /v1/budgets --------------------------------------------------------------------


def test_operator_sets_and_changes_a_budget(operator, org):
    project, user = ProjectFactory(org=org), UserFactory(org=org)
    body = {
        "org": str(org.id),
        "project": str(project.id),
        "user": str(user.id),
        "limit": 9 * CREDIT,
        "period": "month",
        "mode": "hard",
    }
    first = operator.put("/v1/budgets", body, format="json")
    assert first.status_code == 200, first.content
    assert (first.json()["limit"], first.json()["held"], first.json()["mode"]) == (
        9 * CREDIT,
        0,
        "hard",
    )
    changed = operator.put("/v1/budgets", {**body, "mode": "soft"}, format="json")
    assert changed.json()["id"] == first.json()["id"]
    assert Budget.objects.get().mode == "soft"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"limit": -1}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"period": "week"}, "period"),
        ({"mode": "strict"}, "mode"),
        ({"org": None}, "org"),
        ({"user": "00000000-0000-0000-0000-000000000000"}, "user"),
        ({"project": "other-org"}, "project"),
    ],
)
def test_a_bad_budget_body_is_400_naming_the_field(operator, org, changes, field):
    if changes.get("project") == "other-org":
        changes = {"project": str(ProjectFactory().id)}
    body = {"org": str(org.id), "limit": CREDIT, "period": "month", "mode": "hard", **changes}
    response = operator.put("/v1/budgets", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert not Budget.objects.exists()


def test_an_org_key_cannot_set_budgets(tenant, org):
    body = {"org": str(org.id), "limit": 10**15, "period": "total", "mode": "soft"}
    assert tenant.put("/v1/budgets", body, format="json").status_code == 403
    assert not Budget.objects.exists()


# --- GET /v1/balance --------------------------------------------------------------------


def test_balance_shows_available_held_by_kind_and_what_expires_soon(tenant, org):
    soon = timezone.now() + timedelta(days=2)
    promo = BucketFactory(org=org, kind="promo", granted=3 * CREDIT, expires_at=soon)
    BucketFactory(org=org, kind="paid", granted=10 * CREDIT)
    BucketFactory(org=org, kind="grant", granted=CREDIT, expires_at=soon + timedelta(days=30))
    HoldFactory(org=org, amount=4 * CREDIT)  # 3 from the promo, 1 from the grant

    body = tenant.get("/v1/balance").json()

    assert (body["available"], body["held"], body["total"]) == (
        10 * CREDIT,
        4 * CREDIT,
        14 * CREDIT,
    )
    assert body["by_kind"] == {"paid": 10 * CREDIT, "promo": 0, "grant": 0}
    assert [b["kind"] for b in body["buckets"]] == ["promo", "grant", "paid"]
    assert body["buckets"][0] == {
        "id": str(promo.id),
        "kind": "promo",
        "project": None,
        "remaining": 0,
        "held": 3 * CREDIT,
        "expires_at": body["buckets"][0]["expires_at"],
    }
    assert body["expiring_soon"] == []  # nothing left in the promo to lose


def test_balance_of_a_project_counts_its_own_and_org_wide_buckets(tenant, org):
    video, audio = ProjectFactory(org=org, name="video"), ProjectFactory(org=org)
    BucketFactory(org=org, project=video, granted=2 * CREDIT)
    BucketFactory(org=org, project=audio, granted=5 * CREDIT)
    BucketFactory(org=org, granted=CREDIT, expires_at=timezone.now() + timedelta(days=1))
    by_id = tenant.get(f"/v1/balance?project={video.id}").json()
    by_name = tenant.get("/v1/balance?project=video").json()
    assert {**by_id, "as_of": None} == {**by_name, "as_of": None}
    assert by_id["available"] == 3 * CREDIT and by_id["project"] == str(video.id)
    assert [b["remaining"] for b in by_id["expiring_soon"]] == [CREDIT]
    assert tenant.get("/v1/balance").json()["available"] == 8 * CREDIT


def test_balance_of_another_orgs_project_is_404(tenant, org):
    foreign = ProjectFactory()
    response = tenant.get(f"/v1/balance?project={foreign.id}")
    assert response.status_code == 404
    assert tenant.get(f"/v1/balance?org={foreign.org_id}").status_code == 404


def test_a_key_narrowed_to_a_project_sees_that_projects_balance_only(org):
    video, audio = ProjectFactory(org=org), ProjectFactory(org=org)
    BucketFactory(org=org, project=audio, granted=5 * CREDIT)
    client = client_with(org_key(org, project=video))
    assert client.get("/v1/balance").json()["available"] == 0
    assert client.get(f"/v1/balance?project={audio.id}").status_code == 404


def test_an_operator_reads_any_orgs_balance_by_naming_it(operator, org):
    BucketFactory(org=org, granted=CREDIT)
    assert operator.get(f"/v1/balance?org={org.id}").json()["available"] == CREDIT
    missing = operator.get("/v1/balance")
    assert missing.status_code == 400 and missing.json()["error"]["field"] == "org"


# --- GET /v1/ledger/entries -------------------------------------------------------------


def test_entries_are_the_orgs_own_oldest_first_and_filtered_by_job(tenant, org):
    BucketFactory(org=org, granted=10 * CREDIT)
    job = "6f1de3a3-5a0c-4b8e-9d57-0d6c5b4f2e11"
    hold = services.reserve(org=org, amount=2 * CREDIT, idempotency_key="j", job_id=job)
    services.settle(hold, reason="done", final_usage=CREDIT)
    BucketFactory(org=OrgFactory(), granted=CREDIT)  # another org's entries stay hidden

    everything = tenant.get("/v1/ledger/entries").json()["results"]
    assert [e["kind"] for e in everything if e["amount"] > 0] == [
        "issue",
        "hold",
        "capture",
        "settle",
        "refund",
    ]
    assert [e["id"] for e in everything] == sorted(e["id"] for e in everything)
    of_job = tenant.get(f"/v1/ledger/entries?job={job}").json()["results"]
    assert len(of_job) == 8 and {e["job"] for e in of_job} == {job}
    assert {e["hold"] for e in of_job} == {str(hold.id)}
    bad = tenant.get("/v1/ledger/entries?job=nope")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "job"


def test_entries_page_with_an_opaque_cursor_without_gaps_or_repeats(tenant, org):
    for _ in range(4):
        BucketFactory(org=org, granted=CREDIT)
    seen, cursor = [], None
    while True:
        url = "/v1/ledger/entries?limit=3" + (f"&cursor={cursor}" if cursor else "")
        body = tenant.get(url).json()
        seen += [e["id"] for e in body["results"]]
        cursor = body["next"]
        if not cursor:
            break
    assert len(seen) == 8 and seen == sorted(set(seen))


def test_another_orgs_entries_are_404(tenant):
    assert tenant.get(f"/v1/ledger/entries?org={OrgFactory().id}").status_code == 404
