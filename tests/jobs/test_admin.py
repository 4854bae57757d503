"""The operator's admin for jobs: search, filters, inlines, cancel and requeue actions."""

import pytest
from django.contrib.auth import get_user_model

from apps.jobs.models import Job, JobEvent, JobStatus, QuarantinedFingerprint
from apps.ledger.models import HoldState
from tests.factories import OrgFactory
from tests.jobs.factories import JobFactory, funded_org

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]

CHANGELIST = "/admin/jobs/job/"


@pytest.fixture
def staff(client):
    admin = get_user_model().objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(admin)
    return client


def test_jobs_are_searchable_and_filterable_by_status_tier_and_org(staff):
    acme = OrgFactory(name="acme-video", tier="enterprise")
    mine = JobFactory(org=acme, status=JobStatus.RUNNING)
    other = JobFactory(org=OrgFactory(name="zeta", tier="free"), status=JobStatus.QUEUED)

    def listed(query):
        response = staff.get(CHANGELIST + query)
        assert response.status_code == 200
        return {str(j.id) for j in response.context["cl"].result_list}

    assert listed("") == {str(mine.id), str(other.id)}
    assert listed("?q=acme-video") == {str(mine.id)}
    assert listed("?status__exact=queued") == {str(other.id)}
    assert listed("?tier__exact=enterprise") == {str(mine.id)}
    assert listed(f"?org__id__exact={acme.id}") == {str(mine.id)}


def test_the_change_page_shows_the_event_log_and_attempts_read_only(staff):
    job = JobFactory(status=JobStatus.QUEUED)
    JobEvent.objects.create(
        job=job, from_status="queued", to_status="queued", reason="a note", actor="t"
    )
    response = staff.get(f"{CHANGELIST}{job.id}/change/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "a note" in page and "Attempts" in page
    assert "events-0-DELETE" not in page


def test_cancel_action_uses_the_cancel_service(staff):
    org = funded_org()
    job = JobFactory(org=org, status=JobStatus.QUEUED, with_hold=True)
    finished = JobFactory(org=org, status=JobStatus.SUCCEEDED)
    response = staff.post(
        CHANGELIST,
        {"action": "cancel_jobs", "_selected_action": [str(job.id), str(finished.id)]},
        follow=True,
    )
    assert response.status_code == 200
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.hold.state == HoldState.RELEASED
    assert JobEvent.objects.get(job=job, to_status="cancelled").actor == "operator:ops"
    messages = [str(m) for m in response.context["messages"]]
    assert any("1 job(s) cancelled" in m for m in messages)
    assert any("already finished" in m for m in messages)


def test_requeue_action_copies_a_dead_lettered_job_with_a_fresh_hold(staff):
    org = funded_org()
    dead = JobFactory(org=org, status=JobStatus.FAILED, error_code="crashed")
    body = {"action": "requeue_dead_lettered", "_selected_action": [str(dead.id)]}

    staff.post(CHANGELIST, body, follow=True)
    staff.post(CHANGELIST, body, follow=True)  # twice: still one copy

    [copy] = Job.objects.exclude(pk=dead.pk)
    assert copy.status == JobStatus.QUEUED
    assert copy.hold.state == HoldState.ACTIVE
    assert (copy.params, copy.project_id, copy.fingerprint) == (
        dead.params,
        dead.project_id,
        dead.fingerprint,
    )
    assert str(dead.id) in JobEvent.objects.get(job=copy).reason
    assert JobEvent.objects.get(job=dead, data__requeued_as=str(copy.id)).actor == "operator:ops"
    dead.refresh_from_db()
    assert dead.status == JobStatus.FAILED


def test_requeue_refuses_jobs_that_are_not_dead_lettered(staff):
    job = JobFactory(status=JobStatus.SUCCEEDED)
    response = staff.post(
        CHANGELIST,
        {"action": "requeue_dead_lettered", "_selected_action": [str(job.id)]},
        follow=True,
    )
    assert any("only a failed" in str(m) for m in response.context["messages"])
    assert Job.objects.count() == 1


def test_quarantined_fingerprints_are_listed_and_cleared(staff):
    QuarantinedFingerprint.objects.create(fingerprint="ab" * 32, reason="hung twice", node_count=2)
    listing = staff.get("/admin/jobs/quarantinedfingerprint/")
    assert listing.status_code == 200 and b"hung twice" in listing.content
    response = staff.post(
        "/admin/jobs/quarantinedfingerprint/",
        {"action": "delete_selected", "_selected_action": ["ab" * 32], "post": "yes"},
        follow=True,
    )
    assert response.status_code == 200
    assert not QuarantinedFingerprint.objects.exists()
