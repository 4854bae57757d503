"""How a job moves on: the one place that ends a job (and settles its hold) or puts it
back in the queue.

A state transition (lifecycle.transition) moves the job's status and writes its event,
nothing more. Money and follow-ups ride on the outcome, here, in the same transaction:

- end_job: a terminal status, its hold settled at what the attempts used (or released
  when none ran) exactly once, and its webhook queued once the transaction commits
  (when the job asked for the completed event: webhooks.notify);
- requeue_job: back to the queue; a job whose cancel was requested while it ran is
  cancelled on arrival instead (end_job), not left to run again;
- move_job: any status change by the right one of these (terminal, queue, other);
- after_attempt: the job's next status once one of its attempts ended (succeeded,
  cancelled, preempted, timed out, failed with or without a retry), for the runner and
  for lease reaping alike.

Call inside a transaction that holds the job row (lifecycle.transition takes it).
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from apps.jobs import metrics
from apps.jobs.models import TERMINAL_STATUSES, Attempt, ExitClass, Job, JobStatus, WebhookEvent
from apps.jobs.services import billing, lifecycle, quarantine, webhooks
from apps.jobs.services.exits import (
    FAILURE_CLASSES,
    POISON_CLASSES,
    RETRYABLE_CLASSES,
    retry_backoff_s,
)

# A job whose attempt just ended moves on from one of these.
AFTER_ATTEMPT_FROM = (JobStatus.RUNNING, JobStatus.PREEMPTING, JobStatus.SCHEDULED)


def end_job(
    job_id,
    *,
    to: str,
    reason: str,
    actor: str,
    only_from=None,
    attempt: Attempt | None = None,
    changes: dict | None = None,
    data: dict | None = None,
) -> Job:
    """Move the job to the terminal status `to` and settle its hold, exactly once.

    The hold is settled at what the job's attempts used (`attempt`, the one that just
    ended, at exactly its final usage) or released in full when none ran. A second call
    fails at the state guard (IllegalTransition) before it reaches the ledger."""
    if to not in TERMINAL_STATUSES:
        raise ValueError(f"{to} is not a terminal status")
    with transaction.atomic():
        job = lifecycle.transition(
            job_id,
            to=to,
            reason=reason,
            actor=actor,
            only_from=only_from,
            attempt=attempt,
            changes=changes,
            data=data,
        )
        billing.settle_hold(job, reason=f"{to}: {reason}", attempt=attempt)
        webhooks.notify(job, event=WebhookEvent.COMPLETED)
    return job


def requeue_job(
    job_id,
    *,
    reason: str,
    actor: str,
    only_from=None,
    attempt: Attempt | None = None,
    changes: dict | None = None,
    data: dict | None = None,
) -> Job:
    """Put the job back in the queue (its hold stays open); a job asked to cancel while
    it ran or was being preempted is cancelled at once instead (a second event)."""
    with transaction.atomic():
        job = lifecycle.transition(
            job_id,
            to=JobStatus.QUEUED,
            reason=reason,
            actor=actor,
            only_from=only_from,
            attempt=attempt,
            changes=changes,
            data=data,
        )
        if not job.cancel_requested:
            return job
        return end_job(
            job.id,
            to=JobStatus.CANCELLED,
            reason="cancelled: cancel was requested before the job was requeued",
            actor=actor,
            only_from=[JobStatus.QUEUED],
        )


def move_job(job_id, *, to: str, **options) -> Job:
    """Move the job to `to` by the right outcome: end_job for a terminal status (its
    hold settled), requeue_job for the queue, a plain transition otherwise."""
    if to in TERMINAL_STATUSES:
        return end_job(job_id, to=to, **options)
    if to == JobStatus.QUEUED:
        return requeue_job(job_id, **options)
    return lifecycle.transition(job_id, to=to, **options)


def after_attempt(
    job: Job,
    attempt: Attempt,
    *,
    to: str,
    reason: str,
    actor: str,
    data: dict,
    changes: dict | None = None,
) -> Job:
    """The job of an attempt that just ended goes to `to` (ended, or back to the queue)."""
    common = {
        "reason": reason or to,
        "actor": actor,
        "only_from": AFTER_ATTEMPT_FROM,
        "attempt": attempt,
        "changes": changes,
        "data": data,
    }
    if to in TERMINAL_STATUSES:
        return end_job(job.pk, to=to, **common)
    if to == JobStatus.QUEUED:
        return requeue_job(job.pk, **common)
    raise ValueError(f"an ended attempt's job cannot become {to}")


def move_job_on(
    job: Job,
    attempt: Attempt,
    *,
    exit_class: str,
    exit_code: int | None,
    error_message: str,
    checkpoint: str,
    result_path: str,
    resumed_step: int | None,
    actor: str,
) -> Job:
    """The job's next status after its attempt ended as its runner measured (called by
    attempts.finish_attempt, in its transaction, after the attempt row is finished)."""
    if job.status in TERMINAL_STATUSES:
        # Cancelled (or failed by an operator) while it ran: the status is final already.
        return job
    ec = exit_class
    data = {"attempt": attempt.number, "exit_class": ec, "exit_code": exit_code}
    if resumed_step is not None:
        data["resumed_step"] = resumed_step
    checkpoint = {"checkpoint_ref": checkpoint} if checkpoint else {}
    move = partial(after_attempt, job, attempt, actor=actor, data=data)
    if ec == ExitClass.SUCCEEDED:
        changes = {"progress": 1.0, "result_path": result_path}
        return move(to=JobStatus.SUCCEEDED, reason="the generator succeeded", changes=changes)
    if ec == ExitClass.KILLED or job.cancel_requested:
        return move(to=JobStatus.CANCELLED, reason="cancelled while running")
    if ec == ExitClass.PREEMPTED:
        billing.meter_final_usage(job, attempt)
        changes = {"not_before": None, **checkpoint}
        if job.status == JobStatus.PREEMPTING:
            changes["preemption_count"] = F("preemption_count") + 1
            reason = "preempted; resumes from its checkpoint"
        else:  # its worker was shutting down: hand the job back without holding it up
            reason = "its worker shut down; resumes from its checkpoint on another"
        return move(to=JobStatus.QUEUED, reason=reason, changes=changes)
    if ec == ExitClass.TIMED_OUT:
        changes = {"error_code": "timed_out", "error_message": error_message}
        return move(to=JobStatus.TIMED_OUT, reason=error_message, changes=changes)
    return requeue_or_fail(
        job, attempt, reason=error_message, actor=actor, data=data, changes=checkpoint
    )


def requeue_or_fail(
    job: Job, attempt: Attempt, *, reason: str, actor: str, data: dict, changes: dict
) -> Job:
    """After a failed attempt: back to the queue with backoff while tries remain, else failed.

    Retryable exits (crash, OOM up to GANTRY_OOM_RETRIES, hang, node fault, lost lease)
    retry while the job's failed attempts are fewer than job.max_attempts and its params
    are not quarantined; the rest fail with error_code = the exit class ("dead_letter"
    for a lost one). The attempt's usage stays charged either way. Call inside a
    transaction holding the job row, after the attempt row is finished.
    """
    ec = attempt.exit_class
    failures = job.attempts.filter(exit_class__in=FAILURE_CLASSES).count()
    poisoned = quarantine.quarantine_if_poisonous(job) if ec in POISON_CLASSES else None
    retry = ec in RETRYABLE_CLASSES and failures < job.max_attempts and poisoned is None
    if ec == ExitClass.OOM:
        ooms = job.attempts.filter(exit_class=ExitClass.OOM).count()
        retry = retry and ooms <= settings.GANTRY_OOM_RETRIES
    data = {**data, "failures": failures}
    code = "dead_letter" if ec == ExitClass.LOST else ec
    metrics.count_retry_decision(exit_class=ec, retried=retry, error_code=code)
    if retry:
        backoff = retry_backoff_s(failures)
        billing.meter_final_usage(job, attempt)
        return after_attempt(
            job,
            attempt,
            to=JobStatus.QUEUED,
            reason=f"{reason} Retrying in {backoff:g} s "
            f"(failure {failures} of {job.max_attempts}).",
            actor=actor,
            data={**data, "backoff_s": backoff},
            changes={
                "not_before": Now() + timedelta(seconds=backoff),
                "error_code": "",
                "error_message": "",
                **changes,
            },
        )
    message = reason
    if poisoned is not None:
        message += (
            f" Its params are quarantined: they hung or crashed on {poisoned.node_count} nodes."
        )
    elif ec in RETRYABLE_CLASSES:
        message += f" Gave up after {failures} failed attempts."
    return after_attempt(
        job,
        attempt,
        to=JobStatus.FAILED,
        reason=message,
        actor=actor,
        data=data,
        changes={"error_code": code, "error_message": message, **changes},
    )
