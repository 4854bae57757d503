"""The job state machine: the only code that changes Job.status.

Every transition is one guarded UPDATE of the job row plus one JobEvent, in one
transaction, and nothing more (`transition_many` moves several jobs with one UPDATE and
one INSERT): money and follow-ups (settling the hold, the webhook,
cancelling a job that comes back to the queue with a cancel pending) are the job-outcome
service's (apps.jobs.services.outcomes), which every caller that ends or requeues a job
goes through.

    queued → scheduled → running → succeeded | failed | timed_out | cancelled
    running → preempting → queued            (resume from checkpoint)
    scheduled | running → queued             (lost lease or retryable failure)
    queued | scheduled → cancelled | failed  (cancel before start; dead letter)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Value, When
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


@dataclass(frozen=True)
class Move:
    """One job's part of `transition_many`: what `transition` takes for one job."""

    job_id: Any
    reason: str
    public_reason: str = ""
    attempt: Attempt | None = None
    changes: Mapping[str, Any] = field(default_factory=dict)
    data: Mapping[str, Any] | None = None


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
    Returns the job as it now reads.
    """
    move = Move(
        job_id=job_id,
        reason=reason,
        public_reason=public_reason,
        attempt=attempt,
        changes=changes or {},
        data=data,
    )
    with transaction.atomic():
        transition_many([move], to=to, actor=actor, only_from=only_from)
        return Job.objects.get(pk=job_id)


def transition_many(
    moves: Sequence[Move], *, to: str, actor: str, only_from: Iterable[str] | None = None
) -> None:
    """Move every job of `moves` to `to`, all or none: if any job is missing
    (Job.DoesNotExist) or not in a legal source status (IllegalTransition), raise and
    change nothing.

    The jobs are locked in primary-key order (the lock order of several jobs), then one
    guarded UPDATE writes them all (each row only if still in a legal source status, the
    row count checked) and one INSERT their events: a few statements whatever the number
    of jobs. `only_from` and each move's fields mean what they mean to `transition`.
    """
    legal = sources_of(to)
    if only_from is not None:
        legal = legal & frozenset(only_from)
    ids = [str(move.job_id) for move in moves]
    if len(set(ids)) != len(ids):
        raise ValueError("a job moves at most once per call")
    if not moves:
        return
    with transaction.atomic():
        was = {
            str(pk): status
            for pk, status in Job.objects.select_for_update()
            .filter(pk__in=ids)
            .order_by("pk")
            .values_list("pk", "status")
        }
        for job_id in ids:
            if job_id not in was:
                raise Job.DoesNotExist(f"Job {job_id} does not exist.")
            if was[job_id] not in legal:
                raise IllegalTransition(
                    f"Job {job_id} is {was[job_id]}; it cannot become {to}.", field="status"
                )
        fixed = {"status": to}
        if to in TERMINAL_STATUSES:
            fixed["finished_at"] = Now()
        defaults = {"queued_at": Now()} if to == S.QUEUED else {}
        values = [{**defaults, **move.changes, **fixed} for move in moves]
        columns = sorted({name for fields in values for name in fields})
        updates = {}
        for name in columns:
            # A field that a move leaves alone keeps its value; one written alike for
            # every job is one assignment, one that differs a CASE over the jobs.
            per_job = [fields.get(name, F(name)) for fields in values]
            if all(value == per_job[0] for value in per_job[1:]):
                updates[name] = per_job[0]
                continue
            column = Job._meta.get_field(name)
            updates[name] = Case(
                *(
                    When(
                        pk=job_id,
                        then=value
                        if hasattr(value, "resolve_expression")
                        else Value(value, output_field=column),
                    )
                    for job_id, value in zip(ids, per_job, strict=True)
                ),
                output_field=column,
            )
        updated = Job.objects.filter(pk__in=ids, status__in=legal).update(**updates)
        if updated != len(moves):  # cannot happen under the row locks; the guard's proof
            raise IllegalTransition(f"Jobs {', '.join(ids)} changed concurrently.", field="status")
        JobEvent.objects.bulk_create(
            JobEvent(
                job_id=move.job_id,
                attempt=move.attempt,
                from_status=was[job_id],
                to_status=to,
                reason=move.reason,
                actor=actor,
                data=_with_public_reason(move.data, move.public_reason),
            )
            for move, job_id in zip(moves, ids, strict=True)
        )
        for move in moves:
            streams.announce_job_changed(move.job_id)


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
