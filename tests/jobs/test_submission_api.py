"""POST /v1/jobs: admission, validation, credit holds, idempotency, quotas, dedup."""

import math
import threading
import uuid

import psycopg
import pytest
from django.db import connection
from django.test import override_settings
from prometheus_client import REGISTRY

from apps.accounts.models import Tier
from apps.core.redis import redis_client
from apps.jobs import selectors
from apps.jobs.models import Job, JobEvent, JobStatus, QuarantinedFingerprint
from apps.jobs.services import admission
from apps.jobs.services.spec import JobSpec, fingerprint_of
from apps.ledger import selectors as ledger_selectors
from apps.ledger import services as ledger
from apps.ledger.models import Hold
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, UserFactory, org_key
from tests.jobs.factories import (
    CREDIT,
    H100_PRICE,
    JobFactory,
    funded_org,
    grant_credits,
    reset_job_state,
    spec_body,
    submit,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]

API_JOB_FIELDS = {
    "id",
    "status",
    "tier",
    "project",
    "progress",
    "resources",
    "gpu_type",
    "attempts",
    "preemptions",
    "hold",
    "error",
    "result",
    "created_at",
    "started_at",
    "finished_at",
}


@pytest.fixture
def org():
    return funded_org(tier=Tier.PAID)


def test_submission_is_accepted_queued_with_a_hold_for_the_priciest_allowed_type(
    tenant, org, project
):
    response = submit(tenant, spec_body(project=str(project.id)))

    assert response.status_code == 202, response.content
    body = response.json()
    assert set(body) >= API_JOB_FIELDS
    assert body["status"] == "queued" and body["tier"] == "paid"
    assert body["project"] == str(project.id)
    assert body["resources"] == {
        "gpu_count": 1,
        "gpu_types": ["H100", "A100"],
        "min_gpu_memory_gb": 40,
    }
    assert body["progress"] == 0.0 and body["attempts"] == 0 and body["preemptions"] == 0
    assert body["gpu_type"] is None and body["error"] is None and body["result"] is None
    assert body["started_at"] is None and body["finished_at"] is None
    # 600 s x 1 GPU at the H100 price (the priciest allowed), rounded up.
    expected = math.ceil(600 * H100_PRICE / 3600)
    assert body["hold"]["amount"] == expected
    assert body["hold"]["state"] == "active" and body["hold"]["charged"] == 0
    job = Job.objects.get(pk=body["id"])
    assert job.status == JobStatus.QUEUED and job.hold.amount == expected
    assert job.fingerprint == fingerprint_of(
        JobSpec(
            params=body["params"],
            max_runtime_s=600,
            gpu_count=1,
            gpu_types=("H100", "A100"),
            min_gpu_memory_gb=40,
        )
    )
    assert job.queued_at is not None and job.created_at is not None
    assert job.params == body["params"] and job.gpu_types == ["H100", "A100"]
    assert (job.max_attempts, job.progress, job.cancel_requested) == (3, 0.0, False)
    [event] = JobEvent.objects.filter(job=job)
    assert (event.from_status, event.to_status) == ("", "queued")
    assert event.at is not None and event.data["amount"] == expected


def test_successive_submissions_get_time_ordered_job_and_hold_ids(tenant, project):
    # Version-7 ids keep each index's inserts on its right-most leaves (apps/core/ids.py).
    jobs = []
    for _ in range(3):
        response = submit(tenant, spec_body(project=str(project.id)))
        assert response.status_code == 202, response.content
        jobs.append(Job.objects.select_related("hold").get(pk=response.json()["id"]))

    assert [job.id.version for job in jobs] == [7, 7, 7]
    assert [job.hold.id.version for job in jobs] == [7, 7, 7]
    assert sorted(jobs, key=lambda job: job.id) == jobs
    assert sorted(jobs, key=lambda job: job.hold.id) == jobs


def test_a_key_past_its_lock_still_cannot_hold_credit_twice(tenant, org, project, monkeypatch):
    # The hold's own key is its job's id, so what stops a second hold for one
    # Idempotency-Key is the job's unique key in the same transaction.
    assert submit(tenant, spec_body(project=str(project.id)), key="twice").status_code == 202
    held_before = ledger_selectors.balance(org=org)["held"]
    # As if the lock and the read had missed the first job (they cannot).
    monkeypatch.setattr(
        admission,
        "lock_and_read",
        lambda *args, **kwargs: admission.AdmissionSnapshot(None, False, 0),
    )

    with pytest.raises(psycopg.errors.UniqueViolation, match="job_idempotency_key_per_org"):
        submit(tenant, spec_body(project=str(project.id)), key="twice")

    assert Hold.objects.filter(org=org).count() == 1
    assert Job.objects.filter(org=org).count() == 1
    assert ledger_selectors.balance(org=org)["held"] == held_before


def test_hold_uses_only_types_that_meet_the_memory_floor(tenant, project):
    body = spec_body(
        project="video",
        resources={"gpu_count": 2, "gpu_types": ["A100"], "min_gpu_memory_gb": 40},
        max_runtime_s=3600,
    )
    response = submit(tenant, body)
    assert response.status_code == 202, response.content
    assert response.json()["hold"]["amount"] == 2 * 2_500_000


def test_project_may_be_named_and_a_project_key_defaults_to_its_project(org, project):
    other = ProjectFactory(org=org, name="other")
    narrowed = client_with(org_key(org, project=project))
    response = submit(narrowed, spec_body())
    assert response.status_code == 202, response.content
    assert response.json()["project"] == str(project.id)

    refused = submit(narrowed, spec_body(project="other"))
    assert refused.status_code == 403
    assert refused.json()["error"]["field"] == "project"
    assert not Job.objects.filter(project=other).exists()


def test_submission_records_the_keys_user(org, project):
    user = UserFactory(org=org)
    client = client_with(org_key(org, user=user))
    response = submit(client, spec_body(project="video"))
    assert response.status_code == 202
    assert Job.objects.get(pk=response.json()["id"]).user == user
    assert Hold.objects.get(job__pk=response.json()["id"]).user == user


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"resources": {"gpu_count": 1, "gpu_types": ["TPU9"]}}, "resources.gpu_types"),
        ({"resources": {"gpu_count": 0}}, "resources.gpu_count"),
        ({"resources": {"gpu_count": 9}}, "resources.gpu_count"),
        ({"resources": {"gpu_count": 1, "min_gpu_memory_gb": 81}}, "resources.min_gpu_memory_gb"),
        (
            {"resources": {"gpu_types": ["A100"], "min_gpu_memory_gb": 80}},
            "resources.min_gpu_memory_gb",
        ),
        ({"resources": {"gpu_count": 1, "colour": "red"}}, "resources.colour"),
        ({"max_runtime_s": 30 * 24 * 3600}, "max_runtime_s"),
        ({"max_runtime_s": 5}, "max_runtime_s"),
        ({"max_runtime_s": "soon"}, "max_runtime_s"),
        ({"params": "a red fox"}, "params"),
        ({"params": {"prompt": "x" * 70_000}}, "params.prompt"),  # the schema: <= 10,000
        ({"project": "no-such-project"}, "project"),
        ({"project": str(uuid.uuid4())}, "project"),
        ({"webhook_url": "ftp://client.example/hook"}, "webhook_url"),
        ({"webhook_url": "http://203.0.113.9/hook"}, "webhook_url"),
        ({"webhook_url": "https://127.0.0.1/hook"}, "webhook_url"),
        ({"webhook_url": "https://10.1.2.3/hook"}, "webhook_url"),
        ({"webhook_url": "https://169.254.169.254/latest/meta-data"}, "webhook_url"),
        ({"webhook_url": "https://[::1]/hook"}, "webhook_url"),
        ({"webhook_url": "https://localhost/hook"}, "webhook_url"),
        ({"priority": "high"}, "priority"),
        ({"preemptible": "maybe"}, "preemptible"),
        ({"params": None}, "params"),
        ({"resources": "big"}, "resources"),
        ({"resources": {"gpu_types": ["H100", ""]}}, "resources.gpu_types.1"),
        ({"resources": {"gpu_count": "two"}}, "resources.gpu_count"),
    ],
)
def test_invalid_submission_is_400_naming_the_field(tenant, project, change, field):
    body = {**spec_body(project="video"), **change}
    response = submit(tenant, body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field, error
    assert field.split(".")[-1] in error["message"]
    assert not Job.objects.exists() and not Hold.objects.exists()


def test_missing_required_fields_are_named(tenant, project):
    response = submit(tenant, {"project": "video", "params": {}})
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "max_runtime_s"


def test_a_body_that_is_not_an_object_is_400_naming_no_field(tenant, project):
    response = submit(tenant, [spec_body(project="video")])
    assert response.status_code == 400
    assert response.json() == {
        "error": {"code": "invalid", "message": "Expected a JSON object.", "field": None}
    }


def test_another_orgs_project_is_unknown(tenant, project):
    stranger = ProjectFactory(org=OrgFactory())
    response = submit(tenant, spec_body(project=str(stranger.id)))
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "project"


def test_idempotency_key_is_required(tenant, project):
    response = tenant.post("/v1/jobs", spec_body(project="video"), format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "Idempotency-Key"


def test_no_or_bad_key_is_401(anonymous, project):
    assert submit(anonymous, spec_body(project="video")).status_code == 401
    assert submit(client_with("gk_nope_nope"), spec_body(project="video")).status_code == 401


def test_operator_key_cannot_submit(operator, project):
    response = submit(operator, spec_body(project=str(project.id)))
    assert response.status_code == 403


def test_not_enough_credit_is_402_and_leaves_nothing(project):
    poor = OrgFactory()
    ProjectFactory(org=poor, name="video")
    grant_credits(poor, amount=CREDIT // 10)
    response = submit(client_with(org_key(poor)), spec_body(project="video"))
    assert response.status_code == 402, response.content
    assert response.json()["error"]["code"] == "insufficient_credits"
    assert not Job.objects.filter(org=poor).exists() and not Hold.objects.filter(org=poor).exists()


def test_a_submission_larger_than_any_lane_runs_again_and_holds_from_every_lane(project):
    hold = math.ceil(600 * H100_PRICE / 3600)  # spec_body's 600 s on an H100
    org = OrgFactory()
    ProjectFactory(org=org, name="video")
    lanes = override_settings(GANTRY_LEDGER_BUCKET_LANES=4, GANTRY_LEDGER_LANE_MIN=1)
    with lanes:
        grant_credits(org, amount=hold * 8 // 5)  # four lanes of 0.4 holds each
        # The lane statement cannot serve it, and without a savepoint the submission's
        # transaction is aborted: it runs again, and this time draws from every lane.
        response = submit(client_with(org_key(org)), spec_body(project="video"))
    assert response.status_code == 202, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.hold.amount == hold
    assert job.hold.allocations.count() == 3
    assert Job.objects.filter(org=org).count() == Hold.objects.filter(org=org).count() == 1
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.QUEUED).count() == 1
    assert ledger.reconcile(record=False) == []


def test_hard_budget_is_403_and_leaves_nothing(tenant, org, project):
    ledger.set_budget(org=org, project=project, limit=CREDIT // 10, period="month", mode="hard")
    response = submit(tenant, spec_body(project="video"))
    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "budget_exceeded"
    assert not Job.objects.exists() and not Hold.objects.exists()


def test_same_key_and_body_replays_the_same_job_and_one_hold(tenant, project):
    body = spec_body(project="video")
    first = submit(tenant, body, key="k-1")
    again = submit(tenant, body, key="k-1")
    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert Job.objects.count() == 1 and Hold.objects.count() == 1


def test_same_key_with_another_body_is_409(tenant, project):
    submit(tenant, spec_body(project="video"), key="k-1")
    response = submit(tenant, spec_body(project="video", max_runtime_s=900), key="k-1")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_mismatch"
    assert Job.objects.count() == 1 and Hold.objects.count() == 1


def test_keys_are_scoped_to_the_org(tenant, project):
    other = funded_org()
    ProjectFactory(org=other, name="video")
    body = spec_body(project="video")
    mine = submit(tenant, body, key="shared-key")
    theirs = submit(client_with(org_key(other)), body, key="shared-key")
    assert mine.status_code == theirs.status_code == 202
    assert mine.json()["id"] != theirs.json()["id"]


def test_a_refused_submission_can_be_retried_with_the_same_key(project):
    poor = OrgFactory()
    ProjectFactory(org=poor, name="video")
    client = client_with(org_key(poor))
    assert submit(client, spec_body(project="video"), key="retry-me").status_code == 402
    grant_credits(poor)
    assert submit(client, spec_body(project="video"), key="retry-me").status_code == 202


def test_rate_limit_is_429_with_retry_after(project, org):
    org.rate_per_s, org.rate_burst = 0.1, 2
    org.save()
    client = client_with(org_key(org))
    answers = [submit(client, spec_body(project="video")) for _ in range(3)]
    assert [a.status_code for a in answers] == [202, 202, 429]
    assert answers[2].json()["error"]["code"] == "rate_limited"
    assert int(answers[2]["Retry-After"]) >= 1
    assert Job.objects.count() == 2


def test_full_queue_is_429_quota_exceeded(project, org):
    org.max_queued_jobs = 2
    org.save()
    client = client_with(org_key(org))
    answers = [submit(client, spec_body(project="video")) for _ in range(3)]
    assert [a.status_code for a in answers] == [202, 202, 429]
    assert answers[2].json()["error"]["code"] == "quota_exceeded"
    assert int(answers[2]["Retry-After"]) >= 1
    assert Hold.objects.count() == 2


def test_queue_longer_than_a_lowered_quota_is_refused_and_counted_only_up_to_it(project, org):
    JobFactory.create_batch(5, org=org, project=project, status=JobStatus.QUEUED)
    org.max_queued_jobs = 3
    org.save()
    assert selectors.queued_count(org.id, up_to=3) == 3
    assert selectors.queued_count(org.id) == 5
    response = submit(client_with(org_key(org)), spec_body(project="video"))
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert "limit of 3 queued jobs" in error["message"]
    assert Job.objects.filter(org=org).count() == 5
    assert not Hold.objects.filter(org=org).exists()


def test_running_jobs_do_not_count_against_the_queue_quota(project, org):
    org.max_queued_jobs = 1
    org.save()
    JobFactory(org=org, project=project, status=JobStatus.RUNNING)
    response = submit(client_with(org_key(org)), spec_body(project="video"))
    assert response.status_code == 202


@override_settings(GANTRY_SHED_FREE_QUEUE_DEPTH=3)
def test_overload_sheds_the_free_tier_first_and_never_paid_work(project):
    free = funded_org(tier=Tier.FREE)
    ProjectFactory(org=free, name="video")
    JobFactory.create_batch(4, status=JobStatus.QUEUED)
    free_answer = submit(client_with(org_key(free)), spec_body(project="video"))
    assert free_answer.status_code == 429
    assert free_answer.json()["error"]["code"] == "overloaded"
    assert int(free_answer["Retry-After"]) >= 1
    paid_answer = submit(client_with(org_key(project.org)), spec_body(project="video"))
    assert paid_answer.status_code == 202


@override_settings(GANTRY_TIER_AGGREGATE_RATE={"free": {"rate_per_s": 0.01, "burst": 2}})
def test_the_free_tier_shares_one_admission_budget(project):
    free_orgs = [funded_org(tier=Tier.FREE) for _ in range(3)]
    answers = []
    for free in free_orgs:
        ProjectFactory(org=free, name="video")
        answers.append(submit(client_with(org_key(free)), spec_body(project="video")))
    assert [a.status_code for a in answers] == [202, 202, 429]
    paid_answer = submit(client_with(org_key(project.org)), spec_body(project="video"))
    assert paid_answer.status_code == 202


def test_quarantined_params_are_refused_with_422(tenant, project):
    body = spec_body(project="video")
    fingerprint = fingerprint_of(
        JobSpec(
            params=body["params"],
            max_runtime_s=600,
            gpu_count=1,
            gpu_types=("H100", "A100"),
            min_gpu_memory_gb=40,
        )
    )
    QuarantinedFingerprint.objects.create(fingerprint=fingerprint, reason="hung", node_count=3)
    response = submit(tenant, body)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "quarantined"
    assert not Job.objects.exists()


def _succeeded_twin(org, project, body):
    spec = JobSpec(
        params=body["params"],
        max_runtime_s=body["max_runtime_s"],
        gpu_count=body["resources"]["gpu_count"],
        gpu_types=tuple(body["resources"]["gpu_types"]),
        min_gpu_memory_gb=body["resources"]["min_gpu_memory_gb"],
    )
    return JobFactory(
        org=org,
        project=project,
        status=JobStatus.SUCCEEDED,
        params=body["params"],
        gpu_types=list(spec.gpu_types),
        min_gpu_memory_gb=spec.min_gpu_memory_gb,
        fingerprint=fingerprint_of(spec),
        result_path=f"{org.id}/earlier/out.mp4",
        progress=1.0,
    )


def test_dedup_returns_the_earlier_result_without_holding_credit(tenant, org, project):
    org.dedup_enabled = True
    org.save()
    body = spec_body(project="video")
    earlier = _succeeded_twin(org, project, body)

    response = submit(tenant, body)

    assert response.status_code == 202, response.content
    reply = response.json()
    assert reply["status"] == "succeeded" and reply["reused_from"] == str(earlier.id)
    assert reply["hold"] is None and reply["result"]["url"]
    assert not Hold.objects.exists()
    assert Job.objects.get(pk=reply["id"]).result_path == earlier.result_path


def test_a_deduplicated_submission_is_answered_even_when_the_queue_is_full(org, project):
    # Dedup comes before the queue quota: the reused result queues nothing.
    org.dedup_enabled, org.max_queued_jobs = True, 1
    org.save()
    client = client_with(org_key(org))
    JobFactory(org=org, project=project)  # the queue is full
    body = spec_body(project="video")
    earlier = _succeeded_twin(org, project, body)

    response = submit(client, body)

    assert response.status_code == 202, response.content
    assert response.json()["reused_from"] == str(earlier.id)
    another = spec_body(project="video")
    another["params"] = {**another["params"], "seed": 8}  # no twin: it would queue
    assert submit(client, another).status_code == 429


def test_dedup_is_opt_in_and_never_crosses_orgs(tenant, org, project):
    body = spec_body(project="video")
    other = funded_org(dedup_enabled=True)
    _succeeded_twin(other, ProjectFactory(org=other), body)
    _succeeded_twin(org, project, body)

    # `org` has a twin but did not opt in: the job runs again.
    assert submit(tenant, body).json()["status"] == "queued"
    # `third` opted in, but the only other twin is `other`'s: never reused across orgs.
    third = funded_org(dedup_enabled=True)
    ProjectFactory(org=third, name="video")
    assert submit(client_with(org_key(third)), body).json()["status"] == "queued"


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_identical_submissions_make_one_job_and_one_hold():
    reset_job_state()
    org = funded_org(tier=Tier.ENTERPRISE)
    ProjectFactory(org=org, name="video")
    raw_key = org_key(org)
    answers = submit_at_once(raw_key, 20, spec_body(project="video"), key="same-key")

    assert [a.status_code for a in answers] == [202] * 20, [a.content for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert Job.objects.filter(org=org).count() == 1
    assert Hold.objects.filter(org=org).count() == 1
    assert sum(1 for a in answers if a.has_header("Idempotent-Replayed")) == 19


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_never_overshoot_the_queue_quota():
    reset_job_state()
    org = funded_org(tier=Tier.PAID, max_queued_jobs=5)
    ProjectFactory(org=org, name="video")
    answers = submit_at_once(org_key(org), 12, spec_body(project="video"))

    assert sorted(a.status_code for a in answers) == [202] * 5 + [429] * 7
    assert Job.objects.filter(org=org, status=JobStatus.QUEUED).count() == 5


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_as_the_lanes_run_dry_hold_exactly_the_credit_there_is():
    # Four lanes of 2.6 holds each: 10 submissions can be held, and as lanes run dry the
    # lane statements fall back and their submissions run again (no savepoint to return
    # to). Every submission ends 202 or 402, never twice held, never overdrawn.
    reset_job_state()
    hold = math.ceil(600 * H100_PRICE / 3600)
    org = org_with_ten_holds_in_four_lanes(hold)
    fallbacks = {"op": "reserve", "outcome": "lane_fallback"}
    fallbacks_before = REGISTRY.get_sample_value("gantry_ledger_operations_total", fallbacks)
    answers = submit_at_once(org_key(org), 16, spec_body(project="video"))

    assert sorted(a.status_code for a in answers) == [202] * 10 + [402] * 6
    assert Job.objects.filter(org=org).count() == Hold.objects.filter(org=org).count() == 10
    assert sum(Hold.objects.filter(org=org).values_list("amount", flat=True)) == 10 * hold
    assert ledger.reconcile(record=False) == []
    fallbacks_after = REGISTRY.get_sample_value("gantry_ledger_operations_total", fallbacks)
    assert (fallbacks_after or 0) > (fallbacks_before or 0)  # some submission ran again


@pytest.mark.django_db(transaction=True)
def test_concurrent_submissions_of_an_org_with_a_budget_as_its_lanes_run_dry_run_again_as_asked():
    # Each submission may run three times: sent without the budgets' part (the org has a
    # budget), then to its lane (dry), then to every lane. None answers 500, every one
    # 202 or 402, and the budget counts exactly what is held.
    reset_job_state()
    hold = math.ceil(600 * H100_PRICE / 3600)
    org = org_with_ten_holds_in_four_lanes(hold)
    ledger.set_budget(org=org, limit=1000 * hold, period="month", mode="hard")

    answers = submit_at_once(org_key(org), 16, spec_body(project="video"))

    assert sorted(a.status_code for a in answers) == [202] * 10 + [402] * 6
    assert Job.objects.filter(org=org).count() == Hold.objects.filter(org=org).count() == 10
    [budget] = ledger_selectors.budgets_of(org=org)
    held, _consumed = ledger_selectors.budget_usage(budget)
    assert held == 10 * hold
    assert ledger.reconcile(record=False) == []


def org_with_ten_holds_in_four_lanes(hold: int):
    """A paid org with a "video" project and credit for 10.4 holds of `hold`, granted
    in four lanes of 2.6 holds each."""
    org = OrgFactory(tier=Tier.PAID)
    ProjectFactory(org=org, name="video")
    with override_settings(GANTRY_LEDGER_BUCKET_LANES=4, GANTRY_LEDGER_LANE_MIN=1):
        grant_credits(org, amount=hold * 104 // 10)
    return org


def submit_at_once(raw_key: str, count: int, body: dict, *, key: str | None = None) -> list:
    """`count` clients of one org key submit `body` together (each on its own database
    connection, released by one barrier); their answers."""
    barrier = threading.Barrier(count)
    answers = []

    def client_thread():
        client = client_with(raw_key)
        barrier.wait()
        try:
            answers.append(submit(client, body, key=key))
        finally:
            connection.close()

    threads = [threading.Thread(target=client_thread) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_the_queue_is_counted_once_then_estimated_while_far_below_the_quota(
    project, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(admission, "QUEUED_ESTIMATE_TTL_MS", 60_000)  # not a slow run's
    org = funded_org(tier=Tier.ENTERPRISE, max_queued_jobs=1000)
    ProjectFactory(org=org, name="video")
    client = client_with(org_key(org))
    estimate = admission.QUEUED_ESTIMATE_KEY.format(org.id)
    redis_client().delete(estimate)

    with django_capture_on_commit_callbacks(execute=True):
        assert submit(client, spec_body(project="video")).status_code == 202
    assert int(redis_client().get(estimate)) == 1  # counted: 0 queued, plus this one
    JobFactory.create_batch(5, org=org)  # queued behind its back
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            assert submit(client, spec_body(project="video")).status_code == 202
    # Far below the quota the estimate is trusted (each submission adds one) until it
    # expires (a second after the count; a minute here); the five factory jobs wait for
    # the next count.
    assert int(redis_client().get(estimate)) == 3


def test_near_the_quota_the_queue_is_counted_whatever_the_estimate_says(project):
    org = funded_org(tier=Tier.ENTERPRISE, max_queued_jobs=70)
    ProjectFactory(org=org, name="video")
    JobFactory.create_batch(70, org=org)
    # 10 + the 64-job lock margin reaches the quota of 70: the estimate is not trusted.
    redis_client().set(admission.QUEUED_ESTIMATE_KEY.format(org.id), 10, px=60_000)

    response = submit(client_with(org_key(org)), spec_body(project="video"))

    assert response.status_code == 429
    assert response.json()["error"]["code"] == "quota_exceeded"
