"""Recovery: what the periodic beat does when a worker, a message or a finish went missing.

Every service here is safe to run twice at once and to be killed at any point: each item
is handled in its own transaction that locks the job row first and changes the attempt
only through a guarded UPDATE (state and lease re-checked under the lock), so a second
runner finds nothing left to do and a killed one leaves each item done or untouched.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from apps.jobs.metrics import ATTEMPTS
from apps.jobs.models import (
    CLAIMED_ATTEMPT_STATES,
    TERMINAL_STATUSES,
    Attempt,
    AttemptState,
    ExitClass,
    Job,
    JobStatus,
)
from apps.jobs.services import billing, outcomes, stop_requests
from apps.jobs.services.attempts import end_attempt
from apps.jobs.services.outcomes import after_attempt, requeue_or_fail
from apps.ledger.models import HoldState

logger = logging.getLogger(__name__)

ACTOR = "recovery"
LOST_MESSAGE = "The attempt's lease expired: its worker stopped heartbeating (lost)."
RESTARTED_MESSAGE = "Its worker was restarted while the attempt ran (lost)."


@dataclass(frozen=True)
class Reaped:
    attempt_id: str
    job_id: str
    job_status: str


def reap_expired_leases(*, limit: int = 200) -> list[Reaped]:
    """Finish every running attempt whose lease expired (database clock) as `lost`.

    Its worker is dead: the attempt is finished, its GPUs released, the usage it had
    reported stays charged (metered into the hold), and the job goes back to the queue
    with its checkpoint while failed attempts are fewer than max_attempts, else to
    `failed` (error_code "dead_letter"). A job being preempted goes back to the queue; a
    job asked to cancel is cancelled. Returns what this call reaped.
    """
    due = list(
        Attempt.objects.filter(state__in=CLAIMED_ATTEMPT_STATES, lease_expires_at__lt=Now())
        .order_by("lease_expires_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    reaped = []
    for attempt_id in due:
        outcome = reap_attempt(attempt_id)
        if outcome is not None:
            reaped.append(outcome)
    return reaped


def reap_attempts_of_restarted_worker(*, worker: str) -> list[Reaped]:
    """Finish, as `lost`, every attempt still claimed under the name of a worker that is
    starting up, without waiting for their leases.

    Call it before the worker consumes a message: Celery names its live workers
    uniquely (`h100-1@host`), and a worker that has not started a task has claimed
    nothing, so an attempt claimed under its name belongs to a previous process of it
    that is gone (killed, OOM-killed, its host rebooted) and whose runs died with it
    (the generator dies with its worker). Each is ended as reap_expired_leases ends one,
    about GANTRY_LEASE_S sooner: GPUs released, reported usage charged, the job back in
    the queue with its checkpoint (or failed after its last try). Safe to run twice and
    beside the reaper: each attempt is ended once, under its job's lock.
    """
    claimed = list(
        Attempt.objects.filter(state__in=CLAIMED_ATTEMPT_STATES, worker=worker[:200])
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    reaped = []
    for attempt_id in claimed:
        outcome = reap_attempt(attempt_id, restarted_worker=worker[:200])
        if outcome is not None:
            reaped.append(outcome)
    return reaped


def reap_attempt(attempt_id, *, restarted_worker: str | None = None) -> Reaped | None:
    """Reap one attempt if its lease has expired, or, with `restarted_worker`, if that
    worker (restarted since) still holds it; None if it is alive or already reaped."""
    job_id = Attempt.objects.filter(pk=attempt_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    message = LOST_MESSAGE if restarted_worker is None else RESTARTED_MESSAGE
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        lost = end_attempt(
            attempt_id,
            from_states=CLAIMED_ATTEMPT_STATES,
            lease_expired=restarted_worker is None,
            claimed_by=restarted_worker,
            exit_class=ExitClass.LOST,
            error_message=message,
        )
        if not lost:
            return None
        attempt = Attempt.objects.select_related("node").get(pk=attempt_id)
        if job.status not in TERMINAL_STATUSES:  # else only the attempt and GPUs were left
            job = _move_lost_job_on(job, attempt, message=message)
    ATTEMPTS.labels(ExitClass.LOST).inc()
    logger.warning("reaped lost attempt %s of job %s → %s", attempt_id, job_id, job.status)
    return Reaped(str(attempt_id), str(job_id), job.status)


def _move_lost_job_on(job: Job, attempt: Attempt, *, message: str) -> Job:
    """The next status of a job whose attempt was just reaped (inside reap_attempt)."""
    data = {"attempt": attempt.number, "exit_class": ExitClass.LOST, "node": attempt.node.name}
    checkpoint = {"checkpoint_ref": attempt.checkpoint_ref} if attempt.checkpoint_ref else {}
    move = partial(after_attempt, job, attempt, actor=ACTOR, data=data)
    if job.cancel_requested:
        return move(to=JobStatus.CANCELLED, reason="cancelled; its worker was lost")
    if job.status == JobStatus.PREEMPTING:
        billing.meter_final_usage(job, attempt)
        return move(
            to=JobStatus.QUEUED,
            reason="preempted; its worker was lost while stopping",
            changes={"preemption_count": F("preemption_count") + 1, **checkpoint},
        )
    return requeue_or_fail(job, attempt, reason=message, actor=ACTOR, data=data, changes=checkpoint)


def close_stranded_holds(*, limit: int = 200) -> int:
    """Close the active holds of finished jobs (the finish never reached the ledger).

    A job that never started has its hold released; one that ran is settled at the
    usage its attempts recorded (each attempt's figure is metered first, so nothing it
    reported is lost). Also ends jobs whose hold the ledger expired before they finished
    (`failed`, error_code "hold_expired"): they can no longer be paid for. Returns the
    number of jobs handled.
    """
    stranded = list(
        Job.objects.filter(
            Q(status__in=TERMINAL_STATUSES, hold__state=HoldState.ACTIVE)
            | (~Q(status__in=TERMINAL_STATUSES) & ~Q(hold__state=HoldState.ACTIVE)),
            hold__isnull=False,
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
    handled = 0
    for job_id in stranded:
        handled += bool(close_stranded_hold(job_id))
    return handled


def close_stranded_hold(job_id) -> bool:
    """Close one stranded hold (see close_stranded_holds); False if nothing was left to do."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.hold_id is None:
            return False
        hold_state = job.hold.state
        if job.status in TERMINAL_STATUSES:
            if hold_state != HoldState.ACTIVE:
                return False
            for attempt in job.attempts.filter(started_at__isnull=False, charged__gt=0):
                billing.meter_final_usage(job, attempt)
            billing.settle_hold(job, reason=f"{job.status}: recovered by {ACTOR}", attempt=None)
            return True
        if hold_state == HoldState.ACTIVE:
            return False
        # A placed but unclaimed attempt would keep its GPUs: close it with the job.
        for unclaimed in job.attempts.filter(state=AttemptState.SCHEDULED).values_list(
            "pk", flat=True
        ):
            end_attempt(
                unclaimed,
                from_states=[AttemptState.SCHEDULED],
                exit_class=ExitClass.KILLED,
                error_message="never started: the job's credit hold expired",
            )
        # A running attempt's runner stops the generator at once (its heartbeat reads
        # the job as ended).
        stop_requests.announce_stop_requested(job.pk)
        outcomes.end_job(
            job.pk,
            to=JobStatus.FAILED,
            reason=f"its credit hold was {hold_state} before the job finished",
            actor=ACTOR,
            changes={
                "error_code": "hold_expired",
                "error_message": "The job's credit hold expired before it could finish.",
            },
        )
        return True
