"""End to end on real PostgreSQL and the real Redis broker: run messages reach the right
node queues, and a dispatcher that dies between commit and publish loses no job."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models.functions import Now

from apps.jobs.models import Attempt, AttemptState, ExitClass, GpuAssignment, Job, JobEvent
from apps.jobs.models import JobStatus as S
from apps.scheduler.services.dispatch import RUN_ATTEMPT_TASK, run_dispatch_tick
from apps.scheduler.services.recovery import republish_unclaimed_attempts
from tests.scheduler.factories import (
    JobFactory,
    NodeFactory,
    clear_queue,
    live_attempt,
    queue_length,
    run_messages,
    start_attempt,
    subprocess_database_url,
)

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = settings.BASE_DIR


@pytest.fixture
def nodes():
    """Two nodes with empty queues; their queues are cleared again afterwards."""
    made = [NodeFactory(gpus=2), NodeFactory(gpus=4, gpus__type="A100")]
    for node in made:
        clear_queue(node.name)
    yield made
    for node in made:
        clear_queue(node.name)


def test_tick_turns_queued_jobs_into_attempts_and_run_messages_on_their_nodes(nodes):
    h100_node, a100_node = nodes
    h100_jobs = [JobFactory(gpu_types=["H100"]) for _ in range(2)]
    a100_job = JobFactory(gpu_types=["A100"], gpu_count=3)

    result = run_dispatch_tick()

    assert result.placed == 3
    for job in [*h100_jobs, a100_job]:
        job.refresh_from_db()
        assert job.status == S.SCHEDULED
    assert {live_attempt(j).node for j in h100_jobs} == {h100_node}
    assert live_attempt(a100_job).node == a100_node
    assert GpuAssignment.objects.filter(released_at__isnull=True).count() == 5
    sent_h100 = run_messages(h100_node.name)
    sent_a100 = run_messages(a100_node.name)
    assert [task for task, _ in sent_h100 + sent_a100] == [RUN_ATTEMPT_TASK] * 3
    expected = {
        job.pk: [str(live_attempt(job).pk), live_attempt(job).fencing_token]
        for job in [*h100_jobs, a100_job]
    }
    assert sorted(args for _, args in sent_h100) == sorted(expected[j.pk] for j in h100_jobs)
    assert [args for _, args in sent_a100] == [expected[a100_job.pk]]


def _dispatcher_that_dies_before_publishing() -> subprocess.CompletedProcess:
    """A real dispatcher process, on the test database, killed right after its commit."""
    script = (
        "import os, django\n"
        "django.setup()\n"
        "from apps.scheduler.services import dispatch\n"
        "def die(**kwargs):\n"
        "    os._exit(17)  # the process dies after the commit, before the publish\n"
        "dispatch.publish_run_attempt = die\n"
        "dispatch.run_dispatch_tick()\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": subprocess_database_url(),
        "REDIS_URL": settings.REDIS_URL,
    }
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, timeout=60
    )


def test_a_dispatcher_crash_between_commit_and_publish_leaves_the_job_recoverable(nodes, settings):
    node = nodes[0]
    job = JobFactory(gpu_types=["H100"])

    crashed = _dispatcher_that_dies_before_publishing()

    assert crashed.returncode == 17, crashed.stderr.decode()[-2000:]
    job.refresh_from_db()
    attempt = live_attempt(job)
    assert job.status == S.SCHEDULED and attempt.state == AttemptState.SCHEDULED
    assert queue_length(node.name) == 0  # the run message was lost

    # Recovery re-sends the message of an attempt left unclaimed.
    settings.GANTRY_REPUBLISH_AFTER_S = 0
    recovered = republish_unclaimed_attempts()

    assert recovered.republished == 1 and recovered.requeued == 0
    assert run_messages(node.name) == [(RUN_ATTEMPT_TASK, [str(attempt.pk), attempt.fencing_token])]

    # Nobody claims it: past the claim lease the job goes back to the queue, GPUs freed.
    clear_queue(node.name)
    Attempt.objects.filter(pk=attempt.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    recovered = republish_unclaimed_attempts()

    assert recovered.requeued == 1 and recovered.republished == 0
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.FINISHED and attempt.exit_class == ExitClass.LOST
    assert not GpuAssignment.objects.filter(released_at__isnull=True).exists()
    job.refresh_from_db()
    assert job.status == S.QUEUED
    requeued = JobEvent.objects.filter(job=job, to_status=S.QUEUED).get()
    assert "not claimed" in requeued.reason
    assert republish_unclaimed_attempts().requeued == 0  # nothing left to do

    # The next tick places it again, with a new attempt and a newer fencing token.
    run_dispatch_tick()
    again = live_attempt(job)
    assert again.number == 2 and again.fencing_token > attempt.fencing_token
    assert run_messages(node.name) == [(RUN_ATTEMPT_TASK, [str(again.pk), again.fencing_token])]


def test_a_claimed_attempt_is_neither_republished_nor_requeued(nodes, settings):
    job = JobFactory(gpu_types=["H100"])
    run_dispatch_tick()
    attempt = live_attempt(job)
    clear_queue(nodes[0].name)
    start_attempt(attempt)
    settings.GANTRY_REPUBLISH_AFTER_S = 0

    recovered = republish_unclaimed_attempts()

    assert (recovered.republished, recovered.requeued) == (0, 0)
    assert queue_length(nodes[0].name) == 0
    assert Job.objects.get(pk=job.pk).status == S.RUNNING
