"""The operators' job actions over the API: cancel any org's job, requeue a dead-lettered
one, list and lift quarantines. Each goes through apps.jobs.operations, as the admin's
actions do, and is recorded as an operator action with the key as its actor; a refused
call records nothing."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.models import APIKey, OperatorAction
from apps.jobs.models import AttemptState, Job, JobEvent, JobStatus, QuarantinedFingerprint
from apps.jobs.services.outcomes import end_job
from apps.ledger import services as ledger
from tests.factories import ProjectFactory
from tests.jobs.factories import JobFactory, funded_org, place

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]


@pytest.fixture
def other_org(db):
    """An org the operator acts on (the operator key belongs to none)."""
    return funded_org()


def job_of(org, status, **fields):
    return JobFactory(
        org=org, project=ProjectFactory(org=org), status=status, with_hold=True, **fields
    )


def operator_actor() -> str:
    return f"api:{APIKey.objects.get(is_operator=True).prefix}"


def fingerprint(n: int) -> str:
    return f"{n:064x}"


# Cancel


def test_an_operator_cancels_another_orgs_queued_job_and_its_hold_is_released(operator, other_org):
    job = job_of(other_org, JobStatus.QUEUED)

    response = operator.post(f"/v1/jobs/{job.id}/cancel")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == str(job.id) and body["status"] == "cancelled"
    assert body["hold"]["state"] == "released" and body["hold"]["charged"] == 0
    [row] = OperatorAction.objects.filter(action="job.cancel")
    assert row.actor == operator_actor()
    assert (row.org_id, row.job_id, row.target_id) == (other_org.id, job.id, str(job.id))
    assert row.before == {"status": "queued"}
    assert row.after == {"status": "cancelled", "cancel_requested": False}
    event = JobEvent.objects.get(job=job, to_status="cancelled")
    assert event.actor == operator_actor() and event.reason == "cancelled by an operator"


def test_an_operator_cancels_a_running_job_which_is_charged_for_the_time_it_ran(
    operator, other_org
):
    job = job_of(other_org, JobStatus.RUNNING)
    attempt = place(job, state=AttemptState.RUNNING, started=True)

    response = operator.post(f"/v1/jobs/{job.id}/cancel")

    # As for a tenant: the worker stops the run at its next heartbeat.
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "running"
    assert response.json()["cancel_requested"] is True
    [row] = OperatorAction.objects.filter(action="job.cancel")
    assert row.before == {"status": "running"}
    assert row.after == {"status": "running", "cancel_requested": True}
    used = job.hold.amount // 10
    ledger.meter(job.hold, cumulative_usage=used, seq=1, attempt_key=str(attempt.id))
    attempt.charged = used
    attempt.save(update_fields=["charged"])
    end_job(job.id, to=JobStatus.CANCELLED, reason="stopped", actor="worker", attempt=attempt)
    final = operator.get(f"/v1/jobs/{job.id}").json()
    assert final["status"] == "cancelled"
    assert final["hold"]["state"] == "settled" and final["hold"]["charged"] == used


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.CANCELLED])
def test_an_operator_cancelling_a_finished_job_is_409_and_records_nothing(
    operator, other_org, status
):
    job = JobFactory(org=other_org, status=status)

    response = operator.post(f"/v1/jobs/{job.id}/cancel")

    assert response.status_code == 409
    assert response.json()["error"]["field"] == "status"
    assert not OperatorAction.objects.exists()


def test_an_operator_cancelling_an_unknown_job_is_404(operator):
    response = operator.post(f"/v1/jobs/{uuid.uuid4()}/cancel")

    assert response.status_code == 404
    assert not OperatorAction.objects.exists()


def test_a_tenant_cancelling_its_own_job_is_not_an_operator_action(tenant, org):
    job = job_of(org, JobStatus.QUEUED)

    response = tenant.post(f"/v1/jobs/{job.id}/cancel")

    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert not OperatorAction.objects.exists()
    assert JobEvent.objects.get(job=job, to_status="cancelled").reason == "cancelled by the client"


def test_an_operator_reads_any_orgs_job_and_its_events(operator, other_org):
    job = job_of(other_org, JobStatus.QUEUED)

    detail = operator.get(f"/v1/jobs/{job.id}")
    events = operator.get(f"/v1/jobs/{job.id}/events")

    assert detail.status_code == 200 and detail.json()["id"] == str(job.id)
    assert events.status_code == 200
    assert [e["to"] for e in events.json()["results"]] == ["queued"]


def test_an_operator_key_still_cannot_submit(operator, other_org):
    response = operator.post(
        "/v1/jobs", {"project": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="operator-submit"
    )

    assert response.status_code == 403
    assert Job.objects.count() == 0


# Requeue


def test_an_operator_requeues_a_dead_lettered_job_as_a_new_job(operator, other_org):
    dead = job_of(other_org, JobStatus.FAILED, error_code="crashed")

    response = operator.post(f"/v1/jobs/{dead.id}/requeue")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != str(dead.id)
    assert body["status"] == "queued" and body["hold"]["state"] == "active"
    copy = Job.objects.get(pk=body["id"])
    assert (copy.org_id, copy.project_id, copy.params) == (
        other_org.id,
        dead.project_id,
        dead.params,
    )
    dead.refresh_from_db()
    assert dead.status == JobStatus.FAILED
    [row] = OperatorAction.objects.filter(action="job.requeue")
    assert row.actor == operator_actor()
    assert (row.org_id, row.job_id) == (other_org.id, dead.id)
    assert row.before == {"status": "failed"}
    assert row.after["requeued_as"] == str(copy.id)
    assert JobEvent.objects.get(job=dead, data__requeued_as=str(copy.id)).actor == (
        operator_actor()
    )


def test_requeuing_twice_answers_the_same_copy_and_records_one_action(operator, other_org):
    dead = job_of(other_org, JobStatus.FAILED, error_code="crashed")

    first = operator.post(f"/v1/jobs/{dead.id}/requeue")
    second = operator.post(f"/v1/jobs/{dead.id}/requeue")

    assert first.status_code == second.status_code == 201
    assert first.json()["id"] == second.json()["id"]
    assert Job.objects.filter(org=other_org).count() == 2  # the original and one copy
    assert OperatorAction.objects.filter(action="job.requeue").count() == 1


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.QUEUED, JobStatus.CANCELLED])
def test_requeuing_a_job_that_is_not_dead_lettered_is_409_and_records_nothing(
    operator, other_org, status
):
    job = JobFactory(org=other_org, status=status)

    response = operator.post(f"/v1/jobs/{job.id}/requeue")

    assert response.status_code == 409
    assert response.json()["error"]["field"] == "status"
    assert Job.objects.count() == 1
    assert not OperatorAction.objects.exists()


def test_requeuing_an_unknown_job_is_404(operator):
    assert operator.post(f"/v1/jobs/{uuid.uuid4()}/requeue").status_code == 404


def test_an_org_key_cannot_requeue_even_its_own_job(tenant, org):
    dead = job_of(org, JobStatus.FAILED)

    response = tenant.post(f"/v1/jobs/{dead.id}/requeue")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    assert Job.objects.count() == 1
    assert not OperatorAction.objects.exists()


# Quarantine


def quarantine(n: int, *, minutes_ago: int = 0, sample_job=None) -> QuarantinedFingerprint:
    row = QuarantinedFingerprint.objects.create(
        fingerprint=fingerprint(n),
        reason=f"hung on {n + 1} nodes",
        node_count=n + 1,
        sample_job=sample_job,
    )
    at = timezone.now() - timedelta(minutes=minutes_ago)
    QuarantinedFingerprint.objects.filter(pk=row.pk).update(created_at=at)
    row.refresh_from_db()
    return row


def test_an_operator_lists_quarantined_fingerprints_newest_first(operator, other_org):
    sample = JobFactory(org=other_org, status=JobStatus.FAILED)
    old = quarantine(1, minutes_ago=30)
    new = quarantine(2, minutes_ago=1, sample_job=sample)

    response = operator.get("/v1/quarantine")

    assert response.status_code == 200
    body = response.json()
    assert body["next"] is None
    assert [row["fingerprint"] for row in body["results"]] == [new.fingerprint, old.fingerprint]
    assert body["results"][0] == {
        "fingerprint": new.fingerprint,
        "reason": "hung on 3 nodes",
        "node_count": 3,
        "sample_job": str(sample.id),
        "created_at": body["results"][0]["created_at"],
    }
    assert body["results"][1]["sample_job"] is None


def test_the_quarantine_list_pages_with_its_cursor(operator):
    for n in range(3):
        quarantine(n, minutes_ago=n)

    first = operator.get("/v1/quarantine?limit=2").json()
    second = operator.get("/v1/quarantine", {"limit": 2, "cursor": first["next"]}).json()

    assert [r["fingerprint"] for r in first["results"]] == [fingerprint(0), fingerprint(1)]
    assert [r["fingerprint"] for r in second["results"]] == [fingerprint(2)]
    assert second["next"] is None


def test_an_operator_lifts_a_quarantine_and_the_params_may_be_submitted_again(operator, other_org):
    sample = JobFactory(org=other_org, status=JobStatus.FAILED)
    row = quarantine(7, sample_job=sample)

    response = operator.delete(f"/v1/quarantine/{row.fingerprint}")

    assert response.status_code == 204
    assert not QuarantinedFingerprint.objects.exists()
    [action] = OperatorAction.objects.filter(action="quarantine.clear")
    assert action.actor == operator_actor()
    assert (action.target_type, action.target_id) == ("fingerprint", row.fingerprint)
    assert (action.org_id, action.job_id) == (other_org.id, sample.id)
    assert action.before == {"reason": "hung on 8 nodes", "node_count": 8}


@pytest.mark.parametrize("path", [fingerprint(9), "not-a-fingerprint", "x" * 300])
def test_lifting_a_quarantine_that_is_not_there_is_404_and_records_nothing(operator, path):
    response = operator.delete(f"/v1/quarantine/{path}")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert not OperatorAction.objects.exists()


def test_lifting_a_quarantine_twice_is_404_the_second_time(operator):
    row = quarantine(3)

    assert operator.delete(f"/v1/quarantine/{row.fingerprint}").status_code == 204
    assert operator.delete(f"/v1/quarantine/{row.fingerprint}").status_code == 404
    assert OperatorAction.objects.filter(action="quarantine.clear").count() == 1


@pytest.mark.parametrize("method", ["get", "delete"])
def test_an_org_key_cannot_see_or_lift_quarantines(tenant, method):
    row = quarantine(4)
    path = "/v1/quarantine" if method == "get" else f"/v1/quarantine/{row.fingerprint}"

    response = getattr(tenant, method)(path)

    assert response.status_code == 403
    assert QuarantinedFingerprint.objects.filter(pk=row.pk).exists()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/v1/jobs/{job}/requeue"),
        ("get", "/v1/quarantine"),
        ("delete", "/v1/quarantine/{fp}"),
    ],
)
def test_without_a_key_the_operator_job_actions_are_401(anonymous, method, path):
    url = path.format(job=uuid.uuid4(), fp=fingerprint(1))
    assert getattr(anonymous, method)(url).status_code == 401
