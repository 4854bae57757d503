"""What a narrowed API key sees: a project-bound key lives in its project, wholly.

The scenario of issue 17: a key of project p2 sending the same Idempotency-Key and body
as a key of p1 got p1's job back, with its params and result link, and read the whole
org's ledger. A user-bound key (no project) is an attribution, not a wall: it reads
what an org key reads (docs/api.md, "Keys and scopes").
"""

from __future__ import annotations

import pytest

from apps.jobs.models import Job
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, UserFactory, org_key
from tests.jobs.factories import demo_gpu_types, grant_credits, spec_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_projects(db):
    demo_gpu_types()
    org = OrgFactory()
    p1, p2 = ProjectFactory(org=org, name="p1"), ProjectFactory(org=org, name="p2")
    grant_credits(org)
    return org, p1, p2


def submit(client, key: str, **body):
    return client.post("/v1/jobs", spec_body(**body), format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_the_same_idempotency_key_from_another_project_is_a_new_request(two_projects):
    org, p1, p2 = two_projects
    k1, k2 = client_with(org_key(org, project=p1)), client_with(org_key(org, project=p2))
    first = submit(k1, "same-key")
    assert first.status_code == 202
    second = submit(k2, "same-key")
    assert second.status_code == 202, second.content
    assert second.json()["id"] != first.json()["id"]
    assert second.json()["project"] == str(p2.id)
    assert "Idempotent-Replayed" not in second
    # ...and each key still replays its own job.
    assert submit(k1, "same-key").json()["id"] == first.json()["id"]
    assert submit(k2, "same-key").json()["id"] == second.json()["id"]


def test_a_p2_key_naming_p1_in_the_body_is_refused_and_learns_nothing(two_projects):
    org, p1, p2 = two_projects
    k1, k2 = client_with(org_key(org, project=p1)), client_with(org_key(org, project=p2))
    first = submit(k1, "k", project="p1")
    response = submit(k2, "k", project="p1")
    assert response.status_code == 403
    assert first.json()["id"] not in response.content.decode()
    assert Job.objects.count() == 1


def test_a_p2_key_cannot_read_list_or_cancel_p1s_jobs(two_projects):
    org, p1, p2 = two_projects
    k1, k2 = client_with(org_key(org, project=p1)), client_with(org_key(org, project=p2))
    job_id = submit(k1, "k").json()["id"]
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/result"):
        assert k2.get(path).status_code == 404, path
    assert k2.post(f"/v1/jobs/{job_id}/cancel").status_code == 404
    assert k2.get("/v1/jobs").json()["results"] == []
    assert [j["id"] for j in k1.get("/v1/jobs").json()["results"]] == [job_id]


def test_a_project_key_reads_only_its_projects_ledger_entries(two_projects):
    org, p1, p2 = two_projects
    k1, k2 = client_with(org_key(org, project=p1)), client_with(org_key(org, project=p2))
    job_id = submit(k1, "k").json()["id"]
    org_wide = client_with(org_key(org)).get("/v1/ledger/entries").json()["results"]
    assert org_wide, "the org key sees the grant and the hold"
    assert k2.get("/v1/ledger/entries").json()["results"] == []
    assert k2.get(f"/v1/ledger/entries?job={job_id}").json()["results"] == []
    p1_entries = k1.get("/v1/ledger/entries").json()["results"]
    assert p1_entries and len(p1_entries) < len(org_wide)  # the org-wide grant is not p1's
    assert all(e["kind"] != "grant" for e in p1_entries)


def test_a_project_key_lists_only_its_projects_keys(two_projects):
    org, p1, p2 = two_projects
    raw = org_key(org, project=p2)
    org_key(org, project=p1)
    org_key(org)
    listed = client_with(raw).get("/v1/api-keys").json()["results"]
    assert [k["project"] for k in listed] == [str(p2.id)]


def test_a_user_bound_key_reads_what_an_org_key_reads(two_projects):
    org, _, _ = two_projects
    alice, bob = UserFactory(org=org), UserFactory(org=org)
    job_id = submit(client_with(org_key(org, user=alice)), "k", project="p1").json()["id"]
    as_bob = client_with(org_key(org, user=bob))
    assert as_bob.get(f"/v1/jobs/{job_id}").status_code == 200
    assert [j["id"] for j in as_bob.get("/v1/jobs").json()["results"]] == [job_id]
