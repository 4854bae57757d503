"""Reading jobs: one job, listing with filters and cursors, the event log; tenancy."""

from urllib.parse import quote

import pytest

from apps.jobs.models import JobStatus
from apps.jobs.services.outcomes import end_job
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, org_key
from tests.jobs.factories import JobFactory, spec_body, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]


def test_get_job_answers_the_job_body(tenant, project):
    job_id = submit(tenant, spec_body(project="video")).json()["id"]
    response = tenant.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == job_id and body["status"] == "queued"
    assert body["hold"]["state"] == "active"
    assert body["created_at"].endswith("Z")


def test_another_orgs_job_is_404_everywhere(tenant):
    theirs = JobFactory(org=OrgFactory(), status=JobStatus.SUCCEEDED, result_path="x/y/z.mp4")
    for method, path in [
        ("get", f"/v1/jobs/{theirs.id}"),
        ("get", f"/v1/jobs/{theirs.id}/events"),
        ("get", f"/v1/jobs/{theirs.id}/result"),
        ("post", f"/v1/jobs/{theirs.id}/cancel"),
    ]:
        response = getattr(tenant, method)(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
    assert tenant.get("/v1/jobs").json()["results"] == []


def test_unknown_job_is_404(tenant):
    assert tenant.get("/v1/jobs/00000000-0000-0000-0000-000000000000").status_code == 404


def test_a_project_key_reads_only_its_projects_jobs(org, project):
    other = ProjectFactory(org=org)
    mine = JobFactory(org=org, project=project)
    theirs = JobFactory(org=org, project=other)
    narrowed = client_with(org_key(org, project=project))
    assert narrowed.get(f"/v1/jobs/{mine.id}").status_code == 200
    assert narrowed.get(f"/v1/jobs/{theirs.id}").status_code == 404
    assert [j["id"] for j in narrowed.get("/v1/jobs").json()["results"]] == [str(mine.id)]


def test_list_filters_by_status_and_project(tenant, org, project):
    other = ProjectFactory(org=org, name="other")
    queued = JobFactory(org=org, project=project)
    running = JobFactory(org=org, project=project, status=JobStatus.RUNNING)
    elsewhere = JobFactory(org=org, project=other)

    def ids(query):
        response = tenant.get(f"/v1/jobs{query}")
        assert response.status_code == 200, response.content
        return {j["id"] for j in response.json()["results"]}

    assert ids("") == {str(queued.id), str(running.id), str(elsewhere.id)}
    assert ids("?status=running") == {str(running.id)}
    assert ids("?project=video") == {str(queued.id), str(running.id)}
    assert ids(f"?project={other.id}&status=queued") == {str(elsewhere.id)}


@pytest.mark.parametrize(
    ("query", "field"),
    [("?status=lost", "status"), ("?project=nope", "project"), ("?cursor=bz14", "cursor")],
)
def test_list_refuses_bad_filters_naming_them(tenant, project, query, field):
    response = tenant.get(f"/v1/jobs{query}")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_list_pages_with_an_opaque_cursor_newest_first(tenant, org, project):
    jobs = [JobFactory(org=org, project=project) for _ in range(5)]
    seen, query = [], "?limit=2"
    while True:
        page = tenant.get(f"/v1/jobs{query}").json()
        assert len(page["results"]) <= 2
        seen += [j["id"] for j in page["results"]]
        if not page["next"]:
            break
        query = f"?limit=2&cursor={quote(page['next'])}"
    assert seen == [str(j.id) for j in reversed(jobs)]


def test_events_are_listed_oldest_first(tenant, project):
    job_id = submit(tenant, spec_body(project="video")).json()["id"]
    end_job(job_id, to=JobStatus.CANCELLED, reason="changed my mind", actor="test")
    response = tenant.get(f"/v1/jobs/{job_id}/events")
    assert response.status_code == 200
    events = response.json()["results"]
    assert [(e["from"], e["to"]) for e in events] == [(None, "queued"), ("queued", "cancelled")]
    assert events[1]["reason"] == "changed my mind"
    assert all(e["at"].endswith("Z") for e in events)


def test_job_endpoints_need_a_key(anonymous):
    assert anonymous.get("/v1/jobs").status_code == 401
    assert anonymous.get("/v1/jobs/00000000-0000-0000-0000-000000000000").status_code == 401


def test_the_openapi_schema_documents_the_job_endpoints(client):
    schema = client.get("/v1/schema/")
    assert schema.status_code == 200
    for path in (b"/v1/jobs", b"/v1/jobs/{job_id}/cancel", b"/v1/jobs/{job_id}/result"):
        assert path in schema.content


def test_listing_costs_the_same_few_queries_for_any_page_size(
    tenant, org, project, django_assert_max_num_queries
):
    for _ in range(20):
        JobFactory(org=org, project=project, status=JobStatus.SUCCEEDED, with_hold=True)
    # Key lookup, the page of jobs with their holds: no query per job.
    with django_assert_max_num_queries(2):
        page = tenant.get("/v1/jobs?limit=20").json()
    assert len(page["results"]) == 20 and all(j["hold"] for j in page["results"])
