"""The operator's admin for jobs: search, filters, inlines, cancel and requeue actions."""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.accounts.models import Tier
from apps.jobs.models import Job, JobEvent, JobStatus, QuarantinedFingerprint
from apps.ledger.models import HoldState
from apps.scheduler.services.dispatch import run_dispatch_tick
from tests.factories import OrgFactory
from tests.jobs.factories import JobFactory, funded_org
from tests.scheduler.factories import JobFactory as SchedulerJobFactory
from tests.scheduler.factories import NodeFactory

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


def test_search_finds_jobs_by_their_hold_org_or_project_id_project_name_or_fingerprint(staff):
    acme = funded_org(name="acme-video", tier="paid")
    held = JobFactory(org=acme, with_hold=True, params={"prompt": "one of a kind", "steps": 9})
    other = JobFactory(org=OrgFactory(name="zeta", tier="free"))
    other.project.name = "storyboards"
    other.project.save()

    def found(term):
        response = staff.get(CHANGELIST, {"q": term})
        assert response.status_code == 200
        return {str(j.id) for j in response.context["cl"].result_list}

    assert found(str(held.id)) == {str(held.id)}
    assert found(str(held.hold_id)) == {str(held.id)}
    assert found(str(acme.id)) == {str(held.id)}
    assert found(str(other.project_id)) == {str(other.id)}
    assert found("storyboard") == {str(other.id)}
    assert found("ACME") == {str(held.id)}
    assert found(held.fingerprint) == {str(held.id)}
    assert found("nothing-by-that-name") == set()


def test_the_org_filter_names_only_the_org_chosen_and_a_malformed_one_is_refused(staff):
    orgs = [OrgFactory(name=f"tenant-{n}") for n in range(3)]
    jobs = [JobFactory(org=org) for org in orgs]

    def org_choices(response):
        (spec,) = (f for f in response.context["cl"].filter_specs if f.title == "org")
        return [c["display"] for c in spec.choices(response.context["cl"])]

    unfiltered = staff.get(CHANGELIST)
    assert unfiltered.status_code == 200
    assert not any(
        f.title == "org" and f.has_output() for f in unfiltered.context["cl"].filter_specs
    )

    chosen = staff.get(CHANGELIST, {"org__id__exact": str(orgs[1].id)})
    assert {j.id for j in chosen.context["cl"].result_list} == {jobs[1].id}
    assert org_choices(chosen) == ["All", str(orgs[1])]

    malformed = staff.get(CHANGELIST, {"org__id__exact": "not-a-uuid"})
    assert malformed.status_code == 302 and "e=1" in malformed["Location"]


def test_the_job_list_reads_as_many_queries_for_many_jobs_as_for_one(staff):
    def queries_to_list():
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(CHANGELIST).status_code == 200
        return len(captured.captured_queries)

    JobFactory(org=funded_org(), with_hold=True)
    one = queries_to_list()
    for _ in range(6):
        JobFactory(org=funded_org(), with_hold=True)
    assert queries_to_list() == one


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


def test_the_change_page_of_a_queued_job_says_why_it_waits_in_the_operators_words(staff, settings):
    settings.GANTRY_QUEUE_STATE_INTERVAL_S = 0  # the tick explains the queue
    NodeFactory(gpus=1)
    pinned = SchedulerJobFactory(org=OrgFactory(tier=Tier.FREE), preemptible=False)
    page = staff.get(f"{CHANGELIST}{pinned.id}/change/").content.decode()
    assert "waiting to be looked at by the scheduler" in page  # no tick yet
    run_dispatch_tick()
    page = staff.get(f"{CHANGELIST}{pinned.id}/change/").content.decode()
    assert "position unknown · cannot be preempted and needs 1 GPU, more than the free" in page
