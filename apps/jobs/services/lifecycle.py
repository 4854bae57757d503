"""The job state machine: the only code that changes Job.status.

Every transition is one guarded UPDATE of the job row plus one JobEvent, in one
transaction, and nothing more: money and follow-ups (settling the hold, the webhook,
cancelling a job that comes back to the queue with a cancel pending) are the job-outcome
service's (apps.jobs.services.outcomes), which every caller that ends or requeues a job
goes through.

    queued → scheduled → running → succeeded | failed | timed_out | cancelled
    running → preempting → queued            (resume from checkpoint)
    scheduled | running → queued             (lost lease or retryable failure)
    queued | scheduled → cancelled | failed  (cancel before start; dead letter)
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.models.functions import Now

from apps.core.errors import Conflict
from apps.jobs import streams
from apps.jobs.models import TERMINAL_STATUSES, Attempt, Job, JobEvent
from apps.jobs.models import JobStatus as S

ALLOWED: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    S.SCHEDULED: frozenset({S.RUNNING, S.QUEUED, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.PREEMPTING, S.QUEUED}),
    S.PREEMPTING: frozenset({S.QUEUED, S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED}),
}


class IllegalTransition(Conflict):
    code = "illegal_transition"


def sources_of(target: str) -> frozenset[str]:
    """The statuses from which `target` may be entered."""
    return frozenset(source for source, targets in ALLOWED.items() if target in targets)


def transition(
    job_id,
    *,
    to: str,
    reason: str,
    actor: str,
    only_from: Iterable[str] | None = None,
    attempt: Attempt | None = None,
    changes: dict | None = None,
    data: dict | None = None,
    public_reason: str = "",
) -> Job:
    """Move the job to `to`, or raise IllegalTransition and change nothing.

    `reason` is the whole story, for operators (admin, audit trail); `public_reason`,
    when the reason names anything beyond the job's own tenant (another job or org, the
    scheduler's scores), is what the tenant reads instead (`tenant_reason`).

    `only_from` narrows the legal sources further (a caller that expects `running`
    must not move a job that is already `preempting`). `changes` are other job fields
    written by the same UPDATE. Runs in (or opens) a transaction; the job row is
    locked first, before any ledger row, which is the platform's lock order.
    """
    legal = sources_of(to)
    if only_from is not None:
        legal = legal & frozenset(only_from)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.status not in legal:
            raise IllegalTransition(
                f"Job {job.id} is {job.status}; it cannot become {to}.", field="status"
            )
        fields = {"status": to, **(changes or {})}
        if to in TERMINAL_STATUSES:
            fields["finished_at"] = Now()
        if to == S.QUEUED:
            fields.setdefault("queued_at", Now())
        updated = Job.objects.filter(pk=job.pk, status=job.status).update(**fields)
        if updated != 1:  # cannot happen under the row lock; kept as the guard's proof
            raise IllegalTransition(f"Job {job.id} changed concurrently.", field="status")
        JobEvent.objects.create(
            job=job,
            attempt=attempt,
            from_status=job.status,
            to_status=to,
            reason=reason,
            actor=actor,
            data=_with_public_reason(data, public_reason),
        )
        streams.announce_job_changed(job.pk)
        job.refresh_from_db()
        return job


def record_event(
    job: Job, *, reason: str, actor: str, data: dict | None = None, public_reason: str = ""
) -> JobEvent:
    """A note in the job's log that is not a status change (e.g. a retry decision)."""
    return JobEvent.objects.create(
        job=job,
        from_status=job.status,
        to_status=job.status,
        reason=reason,
        actor=actor,
        data=_with_public_reason(data, public_reason),
    )


PUBLIC_REASON = "public_reason"


def _with_public_reason(data: dict | None, public_reason: str) -> dict:
    return {**(data or {}), PUBLIC_REASON: public_reason} if public_reason else (data or {})


def tenant_reason(event: JobEvent) -> str:
    """What the job's tenant reads of `event`: its public wording where the full reason
    names more than the tenant's own job."""
    return (event.data or {}).get(PUBLIC_REASON) or event.reason
