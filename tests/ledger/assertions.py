"""Assertions about the ledger shared by scenario tests of other apps (jobs, workers)."""

from __future__ import annotations

from apps.jobs.models import Attempt, Job
from apps.ledger import services as ledger
from apps.ledger.models import HoldState


def charge_of(attempt: Attempt) -> int:
    """What an attempt should be charged: its metered GPU time at its placement's price."""
    return attempt.gpu_ms * attempt.price_per_gpu_hour // 3_600_000


def assert_ledger_exact(job: Job) -> None:
    """The job's hold is settled at exactly what its attempts measured, the rest refunded,
    and the reconciler finds nothing anywhere."""
    job.refresh_from_db()
    hold = job.hold
    attempts = list(job.attempts.all())
    assert hold.state == HoldState.SETTLED
    for attempt in attempts:
        assert attempt.charged == charge_of(attempt)
    assert hold.captured == sum(a.charged for a in attempts)
    assert hold.refunded == hold.amount - hold.captured
    violations = ledger.reconcile(record=False)
    assert violations == [], "\n".join(map(str, violations))
