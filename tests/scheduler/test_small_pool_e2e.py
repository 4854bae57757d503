"""A one-GPU pool end to end: real PostgreSQL, a real GPU-pool worker and the stand-in
generator. A free job runs alone on the pool; an enterprise job arriving behind it
starts within seconds by preempting it, and the free job resumes from its checkpoint."""

import pytest

from apps.jobs.models import JobEvent, JobStatus
from tests.jobs.factories import funded_org
from tests.ledger.assertions import assert_ledger_exact
from tests.worker_harness import Beat, job_now, pool_fixture, submit_job

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SOLO_FLEET = {
    "gpu_types": {"H100": {"memory_gb": 80, "price_per_gpu_hour": 4_000_000}},
    "nodes": [{"name": "e2e-solo", "gpus": [{"type": "H100"}]}],
}

workers = pool_fixture("e2e-solo")


@pytest.fixture
def beat(workers, settings):
    beat = Beat.over(workers, settings, fleet=SOLO_FLEET)
    yield beat
    beat.drain(timeout=30, dispatch=True)


def test_a_free_job_alone_on_a_one_gpu_pool_starts_within_a_few_ticks(beat, workers):
    job = submit_job(funded_org(tier="free"), prompt="a fox alone", steps=4, step_seconds=0.05)
    ticks = 0

    def started() -> bool:
        nonlocal ticks
        ticks += 1
        return job_now(job).status != JobStatus.QUEUED

    beat.until(started, timeout=10, every=0.05)
    print(f"one-GPU pool: the free job was placed by dispatch tick {ticks}")
    assert ticks <= 3, f"placed after {ticks} ticks"
    beat.until(lambda: job_now(job).is_terminal, timeout=30)
    assert job_now(job).status == JobStatus.SUCCEEDED, workers.logs()
    assert_ledger_exact(job)


def test_an_enterprise_job_preempts_the_free_job_and_the_free_job_resumes(beat, workers):
    free = submit_job(
        funded_org(tier="free"), prompt="a long free fox", steps=300, step_seconds=0.05
    )
    beat.until(lambda: job_now(free).progress >= 0.1, timeout=30)
    urgent = submit_job(
        funded_org(tier="enterprise"), prompt="an urgent fox", steps=6, step_seconds=0.05
    )

    beat.until(lambda: job_now(urgent).started_at is not None, timeout=20)
    urgent = job_now(urgent)
    waited = (urgent.started_at - urgent.queued_at).total_seconds()
    print(f"one-GPU pool: the enterprise job started {waited:.1f} s after its submission")
    assert waited <= 10, f"the enterprise job waited {waited:.1f} s"
    beat.until(lambda: job_now(urgent).is_terminal and job_now(free).is_terminal, timeout=60)

    assert job_now(urgent).status == JobStatus.SUCCEEDED, workers.logs()
    free = job_now(free)
    assert free.status == JobStatus.SUCCEEDED, workers.logs()
    assert free.preemption_count == 1
    reasons = list(JobEvent.objects.filter(job=free).values_list("reason", flat=True))
    assert any("resumed from its checkpoint at step" in reason for reason in reasons), reasons
    assert_ledger_exact(free)
    assert_ledger_exact(urgent)
