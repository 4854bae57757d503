"""The jobs app's one route to the ledger: what a job's attempts used, and its hold's end.

- report_usage: a heartbeat's cumulative usage, to the ledger's batched path (Redis);
  losing a report loses nothing (the attempt row has the figure, the finish sends it).
- meter_final_usage: an ended attempt's exact final usage, made durable on the hold while
  the job goes back to the queue.
- settle_hold: a job's end: its hold settled at what its attempts used, or released in
  full when none ran. The ledger's settle and release are at-most-once.
"""

from __future__ import annotations

import logging

from apps.jobs.models import Attempt, Job
from apps.ledger import services as ledger

logger = logging.getLogger(__name__)

# Reported after every heartbeat's seq: the attempt's last word to the ledger.
FINAL_SEQ = 2**62


def report_usage(hold_id, attempt: Attempt, *, charged: int, seq: int) -> None:
    """Best effort: a heartbeat's cumulative usage to the ledger's batched path."""
    try:
        ledger.record_usage(
            hold_id=hold_id, attempt_key=str(attempt.pk), cumulative_usage=charged, seq=seq
        )
    except Exception as exc:  # Redis is hot, rebuildable state: the finish reports again
        logger.warning("usage report for attempt %s not sent: %s", attempt.pk, exc)


def meter_final_usage(job: Job, attempt: Attempt) -> None:
    """Make the attempt's final usage durable in the ledger while the hold stays open."""
    if job.hold_id is None or attempt.charged <= 0:
        return
    ledger.meter(
        job.hold, cumulative_usage=attempt.charged, seq=FINAL_SEQ, attempt_key=str(attempt.pk)
    )


def settle_hold(job: Job, *, reason: str, attempt: Attempt | None) -> None:
    """Settle the job's hold at what its attempts used, or release it if none ran.

    `attempt`, when it started, is the one that just ended: its usage is settled exactly
    (`final_usage`). Call in the transaction that ends the job, after the job row moved."""
    if job.hold_id is None:
        return
    ran = job.attempts.filter(started_at__isnull=False).exists()
    if not ran:
        ledger.release(job.hold, reason=reason)
        return
    if attempt is not None and attempt.started_at is not None:
        ledger.settle(
            job.hold, reason=reason, final_usage=attempt.charged, attempt_key=str(attempt.id)
        )
    else:
        ledger.settle(job.hold, reason=reason)
