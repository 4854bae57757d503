"""Factories and helpers for the jobs tests: fleet rows, funded orgs, jobs in any state."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from pathlib import Path

import factory
from django.utils import timezone

from apps.jobs.models import (
    Attempt,
    AttemptState,
    GpuAssignment,
    Job,
    JobEvent,
    JobStatus,
)
from apps.jobs.services import results
from apps.jobs.services.spec import JobSpec, fingerprint_of
from tests.factories import OrgFactory, ProjectFactory
from tests.fleet.factories import A100_PRICE as A100_PRICE  # re-exported for the jobs tests
from tests.fleet.factories import H100_PRICE as H100_PRICE
from tests.fleet.factories import BareNodeFactory as NodeFactory
from tests.fleet.factories import GpuFactory as GpuFactory
from tests.fleet.factories import gpu_types as demo_gpu_types

CREDIT = 1_000_000  # micro-credits
_tokens = itertools.count(1_000_000)


def grant_credits(org, amount: int = 1_000_000 * CREDIT, **options):
    from apps.ledger import services as ledger

    return ledger.grant(org=org, amount=amount, kind="paid", **options)


def funded_org(**fields):
    org = OrgFactory(**fields)
    grant_credits(org)
    return org


def spec_body(**overrides) -> dict:
    """A valid POST /v1/jobs body (project added by the caller)."""
    body = {
        "params": {"prompt": "a red fox in snow", "seed": 7, "steps": 20, "step_seconds": 0.5},
        "resources": {"gpu_count": 1, "gpu_types": ["H100", "A100"], "min_gpu_memory_gb": 40},
        "max_runtime_s": 600,
        "preemptible": True,
    }
    body.update(overrides)
    return body


class JobFactory(factory.django.DjangoModelFactory):
    """A job row in any status, with no hold unless `with_hold=True` is passed."""

    class Meta:
        model = Job
        skip_postgeneration_save = True

    class Params:
        with_hold = False

    org = factory.SubFactory(OrgFactory)
    project = factory.LazyAttribute(lambda job: ProjectFactory(org=job.org))
    tier = factory.LazyAttribute(lambda job: job.org.tier)
    status = JobStatus.QUEUED
    params = factory.Sequence(lambda n: {"prompt": f"scene {n}", "steps": 5})
    gpu_count = 1
    gpu_types = factory.LazyFunction(lambda: ["H100"])
    min_gpu_memory_gb = 0
    max_runtime_s = 600
    fingerprint = factory.LazyAttribute(
        lambda job: fingerprint_of(
            JobSpec(
                params=job.params,
                max_runtime_s=job.max_runtime_s,
                gpu_count=job.gpu_count,
                gpu_types=tuple(job.gpu_types),
                min_gpu_memory_gb=job.min_gpu_memory_gb,
            )
        )
    )
    queued_at = factory.LazyFunction(timezone.now)
    finished_at = factory.LazyAttribute(
        lambda job: (
            timezone.now()
            if job.status
            in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.CANCELLED)
            else None
        )
    )

    @factory.lazy_attribute
    def hold(self):
        if not self.with_hold:
            return None
        from apps.ledger import services as ledger

        if not self.org.credit_buckets.exists():
            grant_credits(self.org)
        return ledger.reserve(
            org=self.org,
            amount=self.max_runtime_s * self.gpu_count * H100_PRICE // 3600,
            idempotency_key=f"test-hold:{uuid.uuid4()}",
            project=self.project,
        )

    @factory.post_generation
    def created_event(job, create, extracted, **kwargs):
        if create:
            JobEvent.objects.create(
                job=job, from_status="", to_status=job.status, reason="created", actor="test"
            )


def place(job: Job, *, gpus: int = 1, state: str = AttemptState.SCHEDULED, started=False):
    """Give the job an attempt on a fresh node with `gpus` assigned H100s."""
    demo_gpu_types()
    node = NodeFactory()
    devices = [GpuFactory(node=node, index=i, gpu_type_id="H100") for i in range(gpus)]
    now = timezone.now()
    attempt = Attempt.objects.create(
        job=job,
        org_id=job.org_id,
        number=job.attempt_count + 1,
        node=node,
        gpu_type="H100",
        price_per_gpu_hour=H100_PRICE,
        gpu_indices=[g.index for g in devices],
        devices=",".join(str(g.index) for g in devices),
        fencing_token=next(_tokens),
        state=state,
        lease_expires_at=now + timedelta(minutes=5),
        started_at=now if started else None,
    )
    for gpu in devices:
        GpuAssignment.objects.create(attempt=attempt, gpu=gpu)
    Job.objects.filter(pk=job.pk).update(attempt_count=attempt.number, gpu_type="H100")
    return attempt


def reset_job_state() -> None:
    """Fresh GPU types (and cache) and empty rate-limit buckets for one test."""
    from apps.fleet import selectors
    from apps.jobs.services.admission import redis_client

    selectors.clear_gpu_type_cache()
    demo_gpu_types()
    client = redis_client()
    for pattern in ("gantry:ratelimit:*", "gantry:admission:*", "gantry:webhook:*"):
        keys = list(client.scan_iter(pattern))
        if keys:
            client.delete(*keys)


def submit(client, body: dict, *, key: str | None = None, **headers):
    """POST /v1/jobs with an Idempotency-Key (a fresh one unless given)."""
    return client.post(
        "/v1/jobs",
        body,
        format="json",
        HTTP_IDEMPOTENCY_KEY=key or str(uuid.uuid4()),
        **headers,
    )


def job_with_stored_result(org, *, directory: Path, content: bytes) -> Job:
    """A succeeded job whose output (`content`) went through store_result, as the runner
    stores it, in whichever result storage the settings select."""
    job = JobFactory(org=org, status=JobStatus.SUCCEEDED, progress=1.0)
    output = directory / "run" / "fox.mp4"
    output.parent.mkdir(parents=True)
    output.write_bytes(content)
    key = results.store_result(job, output)
    Job.objects.filter(pk=job.pk).update(result_path=key)
    job.refresh_from_db()
    return job
