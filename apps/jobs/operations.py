"""Operators' job actions, each recorded as an OperatorAction in its transaction (the
admin and the operator API call these; see apps.accounts.operations for the `actor` and
`record_refused` conventions). `event_actor`, the actor written on the job's own events,
defaults to `actor`."""

from __future__ import annotations

from apps.accounts.operator_actions import operator_action
from apps.jobs.models import Job, QuarantinedFingerprint
from apps.jobs.services import quarantine
from apps.jobs.services.cancel import cancel_job
from apps.jobs.services.submission import requeue_failed_job


def cancel(
    job_id,
    *,
    actor: str,
    org_id,
    status: str,
    event_actor: str | None = None,
    record_refused: bool = True,
) -> Job:
    """Cancel a job (services.cancel), recorded as job.cancel with its status before and
    after; `event_actor` is the actor written on the job's own event."""
    with _job_action("job.cancel", job_id, actor, org_id, status, record_refused) as pending:
        job = cancel_job(job_id, actor=event_actor or actor, reason="cancelled by an operator")
        pending.after = {"status": job.status, "cancel_requested": job.cancel_requested}
    return job


def requeue(
    job_id,
    *,
    actor: str,
    org_id,
    status: str,
    event_actor: str | None = None,
    record_refused: bool = True,
) -> Job:
    """Requeue a dead-lettered job as a new one (services.submission), recorded as
    job.requeue; requeuing twice returns the same copy and records one row."""
    with _job_action(
        "job.requeue",
        job_id,
        actor,
        org_id,
        status,
        record_refused,
        idempotency_key=f"job.requeue:{job_id}",
    ) as pending:
        copy = requeue_failed_job(job_id, actor=event_actor or actor)
        pending.after = {"requeued_as": str(copy.id), "copy_status": copy.status}
    return copy


def _job_action(action: str, job_id, actor: str, org_id, status: str, record_refused, **known):
    """The audit record of an action on one job, with its status before."""
    return operator_action(
        actor=actor,
        action=action,
        target_type="job",
        target_id=job_id,
        org_id=org_id,
        job_id=job_id,
        before={"status": status},
        record_refused=record_refused,
        **known,
    )


def clear_quarantine(
    row: QuarantinedFingerprint, *, actor: str, record_refused: bool = True
) -> bool:
    """Lift a quarantine (services.quarantine), recorded as quarantine.clear; clearing one
    already cleared records nothing. True when this call cleared it."""
    sample = row.sample_job
    with operator_action(
        actor=actor,
        action="quarantine.clear",
        target_type="fingerprint",
        target_id=row.fingerprint,
        org_id=sample.org_id if sample else None,
        job_id=sample.pk if sample else None,
        before={"reason": row.reason, "node_count": row.node_count},
        record_refused=record_refused,
    ) as pending:
        pending.skip = not quarantine.clear_quarantine(row.fingerprint)
        pending.after = {"quarantined": False}
    return not pending.skip
