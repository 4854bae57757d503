"""What a tenant reads about a queued job after a dispatch tick: position, reason, estimate."""

import pytest
from django.utils.dateparse import parse_datetime

from apps.accounts.models import Tier
from apps.core.redis import redis_client
from apps.jobs import queue_state
from apps.jobs.models import JobStatus
from apps.scheduler.services.dispatch import run_dispatch_tick
from tests.conftest import client_with
from tests.factories import OrgFactory, UserFactory, org_key
from tests.scheduler.factories import JobFactory, NodeFactory, queued_since

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_stale_states(settings):
    settings.GANTRY_QUEUE_STATE_INTERVAL_S = 0  # every tick explains the queue
    keys = list(redis_client().scan_iter(queue_state.KEY.format("*")))
    if keys:
        redis_client().delete(*keys)


def test_a_job_behind_a_busy_gpu_reads_its_position_reason_and_estimated_start():
    NodeFactory(gpus=1)
    theirs = JobFactory(max_runtime_s=600)
    run_dispatch_tick()  # theirs takes the only GPU
    org = OrgFactory()
    first = JobFactory(org=org, max_runtime_s=300)
    second = JobFactory(org=org, max_runtime_s=300)

    run_dispatch_tick()

    tenant = client_with(org_key(org))
    body = tenant.get(f"/v1/jobs/{first.id}").json()
    assert body["status"] == "queued"
    assert body["queue"]["reason"] == "waiting for an H100: 1 of 1 busy"
    assert body["queue"]["position"] == 1
    first_start = parse_datetime(body["queue"]["estimated_start_at"])
    later = tenant.get(f"/v1/jobs/{second.id}").json()["queue"]
    assert later["position"] == 2
    assert parse_datetime(later["estimated_start_at"]) > first_start
    listed = {job["id"]: job["queue"] for job in tenant.get("/v1/jobs").json()["results"]}
    assert listed[str(first.id)] == body["queue"]
    assert str(theirs.id) not in body["queue"]["reason"]
    assert str(theirs.org_id) not in body["queue"]["reason"]


def test_a_job_no_tick_has_looked_at_says_so_and_a_running_one_has_no_queue():
    NodeFactory(gpus=1)
    org = OrgFactory()
    waiting = JobFactory(org=org)
    tenant = client_with(org_key(org))
    assert tenant.get(f"/v1/jobs/{waiting.id}").json()["queue"] == {
        "position": None,
        "reason": "waiting to be looked at by the scheduler",
        "estimated_start_at": None,
    }
    run_dispatch_tick()
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.SCHEDULED
    assert tenant.get(f"/v1/jobs/{waiting.id}").json()["queue"] is None


def test_a_free_job_that_cannot_be_preempted_on_one_gpu_reads_that_it_cannot_start_here():
    NodeFactory(gpus=1)
    org = OrgFactory(tier=Tier.FREE)
    pinned = JobFactory(org=org, preemptible=False)

    tenant = client_with(org_key(org))
    for _ in range(2):  # the same answer every tick: no estimate sliding forward
        run_dispatch_tick()
        body = tenant.get(f"/v1/jobs/{pinned.id}").json()
        assert body["status"] == "queued"
        assert body["queue"]["position"] is None
        assert body["queue"]["estimated_start_at"] is None
        assert (
            "a job that cannot be preempted runs within its tier's share"
            in (body["queue"]["reason"])
        )
    # Preemptible, the same job borrows the idle GPU.
    JobFactory(org=org)
    run_dispatch_tick()
    assert [j["status"] for j in tenant.get("/v1/jobs").json()["results"]] == [
        "scheduled",
        "queued",
    ]


def test_a_job_beyond_its_submitters_window_reads_that_older_jobs_are_looked_at_first(
    settings,
):
    settings.GANTRY_POLICY = {"queue_depth_per_user": 2, "queue_window_jobs": 0}
    NodeFactory(gpus=1)
    run_dispatch_tick()
    JobFactory(max_runtime_s=600)
    run_dispatch_tick()  # another org's job takes the only GPU
    org = OrgFactory()
    user = UserFactory(org=org)
    mine = [queued_since(100.0 - i, org=org, user=user) for i in range(4)]
    other = queued_since(50.0, org=org)  # the org's own key: another submitter, one job
    solo = OrgFactory()
    alone = JobFactory(org=solo)

    run_dispatch_tick()

    tenant = client_with(org_key(org))
    body = {job: tenant.get(f"/v1/jobs/{job.id}").json()["queue"] for job in [*mine, other]}
    assert [body[job]["position"] is not None for job in mine] == [True, True, False, False]
    behind = (
        "further back than the 2 oldest queued jobs from the same submitter, which the "
        "scheduler looks at first; it comes into view as they start"
    )
    assert [body[job]["reason"] for job in mine[2:]] == [behind, behind]
    assert body[other]["position"] is not None
    listed = {j["id"]: j["queue"] for j in tenant.get("/v1/jobs").json()["results"]}
    assert listed[str(mine[3].id)]["reason"] == behind
    # A submitter whose every queued job the tick looked at has no window, in that org
    # or another: a job submitted after the tick is simply not looked at yet.
    unknown = {
        "position": None,
        "reason": "waiting to be looked at by the scheduler",
        "estimated_start_at": None,
    }
    other_later = JobFactory(org=org)
    assert tenant.get(f"/v1/jobs/{other_later.id}").json()["queue"] == unknown
    later = JobFactory(org=solo)
    solo_tenant = client_with(org_key(solo))
    assert solo_tenant.get(f"/v1/jobs/{alone.id}").json()["queue"]["position"] is not None
    assert solo_tenant.get(f"/v1/jobs/{later.id}").json()["queue"] == unknown
