"""Priced at placement: the attempt carries its GPU type's price, and the job pays that.

The hold was sized for the priciest allowed type; a job placed on a cheaper type is
charged at the cheaper price and the rest of the hold goes back at settlement.
"""

import uuid

import pytest

from apps.fleet.models import GpuType
from apps.jobs.models import Attempt, JobStatus
from apps.jobs.services.outcomes import end_job
from apps.ledger import services as ledger
from apps.ledger.models import HoldState
from apps.scheduler.services.dispatch import run_dispatch_tick
from tests.factories import OrgFactory, ProjectFactory
from tests.scheduler.factories import (
    A100_PRICE,
    H100_PRICE,
    JobFactory,
    NodeFactory,
    live_attempt,
    start_attempt,
)

pytestmark = pytest.mark.django_db

CREDIT = 1_000_000
MS_PER_HOUR = 3_600_000


def job_with_hold(*, gpu_types, gpu_count=1, max_runtime_s=600):
    """A job as submission leaves it: a hold for the priciest allowed type's price."""
    org = OrgFactory()
    project = ProjectFactory(org=org)
    ledger.grant(org=org, amount=1000 * CREDIT, kind="paid")
    priciest = max(
        GpuType.objects.filter(name__in=gpu_types).values_list("price_per_gpu_hour", flat=True)
    )
    hold = ledger.reserve(
        org=org,
        amount=max_runtime_s * gpu_count * priciest // 3600,
        idempotency_key=f"job:{uuid.uuid4()}",
        project=project,
    )
    return JobFactory(
        org=org,
        project=project,
        gpu_types=gpu_types,
        gpu_count=gpu_count,
        max_runtime_s=max_runtime_s,
        hold=hold,
    )


def run_to_success(attempt: Attempt, *, gpu_seconds: int) -> None:
    """The runner's part: meter the usage at the attempt's price, then succeed."""
    gpu_ms = gpu_seconds * 1000 * len(attempt.gpu_indices)
    charged = gpu_ms * attempt.price_per_gpu_hour // MS_PER_HOUR
    Attempt.objects.filter(pk=attempt.pk).update(gpu_ms=gpu_ms, charged=charged)
    attempt.refresh_from_db()
    ledger.meter(attempt.job.hold, cumulative_usage=charged, seq=1, attempt_key=str(attempt.pk))
    end_job(
        attempt.job_id,
        to=JobStatus.SUCCEEDED,
        reason="the generator succeeded",
        actor="worker:test",
        attempt=attempt,
        changes={"progress": 1.0},
    )


def test_a_job_placed_on_the_cheaper_type_pays_the_cheaper_price_and_gets_the_rest_back():
    NodeFactory(gpus=2, gpus__type="A100")  # only A100s are free
    job = job_with_hold(gpu_types=["H100", "A100"], gpu_count=2)
    sized_for_h100 = 600 * 2 * H100_PRICE // 3600
    assert job.hold.amount == sized_for_h100

    run_dispatch_tick()
    attempt = start_attempt(live_attempt(job), ran_for_s=0)

    assert (attempt.gpu_type, attempt.price_per_gpu_hour) == ("A100", A100_PRICE)
    job.refresh_from_db()
    assert job.gpu_type == "A100"

    run_to_success(attempt, gpu_seconds=300)

    job.refresh_from_db()
    hold = job.hold
    hold.refresh_from_db()
    at_a100_price = 300 * 2 * A100_PRICE // 3600
    assert job.status == JobStatus.SUCCEEDED
    assert hold.state == HoldState.SETTLED
    assert hold.captured == at_a100_price
    assert hold.captured < 300 * 2 * H100_PRICE // 3600  # not what an H100 would cost
    assert hold.refunded == sized_for_h100 - at_a100_price


def test_a_price_change_after_placement_does_not_change_what_the_attempt_costs():
    NodeFactory(gpus=1, gpus__type="H100")
    job = job_with_hold(gpu_types=["H100"])
    run_dispatch_tick()
    attempt = start_attempt(live_attempt(job))

    GpuType.objects.filter(name="H100").update(price_per_gpu_hour=H100_PRICE * 3)
    run_to_success(attempt, gpu_seconds=60)

    hold = job.hold
    hold.refresh_from_db()
    assert attempt.price_per_gpu_hour == H100_PRICE
    assert hold.captured == 60 * H100_PRICE // 3600
