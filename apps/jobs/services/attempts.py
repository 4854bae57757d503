"""The attempt state machine: the one place an attempt is claimed, kept alive and ended.

    scheduled ──claim──> running ──(preempt/cancel asks)──> stopping
        │                  │                                   │
        └───────────── end_attempt ──> finished <──────────────┘

- claim_attempt: a guarded UPDATE that checks the fencing token and both states (attempt
  `scheduled`, job `scheduled`); a duplicated, redelivered or late run message cannot
  claim and leaves without a single write.
- heartbeat: extends the lease by the database clock, records usage and progress, guarded
  by the same token and a claimed state; None when the attempt was taken away.
- end_attempt: the one way an attempt ends (its runner's finish, a cancel before it
  started, lease reaping, unclaimed-attempt recovery, an orphan whose job moved on): one
  guarded UPDATE with its row count checked, then its GPUs released by release_gpus, the
  one statement that gives GPUs back.
- finish_attempt: the runner's end of an attempt and its job's next status
  (outcomes.move_job_on), in one transaction.

Every function here runs in (or opens) a transaction that locks the job row first: the
platform's lock order (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.db.models.functions import Coalesce, Greatest, Now

from apps.core.wakeup import wake_dispatcher
from apps.jobs import metrics, streams
from apps.jobs.models import (
    CLAIMED_ATTEMPT_STATES,
    TERMINAL_STATUSES,
    Attempt,
    AttemptState,
    ExitClass,
    GpuAssignment,
    Job,
    JobStatus,
    WebhookEvent,
)
from apps.jobs.services import billing, lifecycle, outcomes, webhooks


class Fenced(Exception):
    """A guarded write found no row: this runner no longer owns the attempt."""


@dataclass(frozen=True)
class JobSignal:
    """What a heartbeat learns about the job: keep going, stop for a cancel or preemption."""

    status: str
    cancel_requested: bool
    stopping: bool

    @property
    def cancel(self) -> bool:
        # Cancel requested, or the job was ended under it (an operator, an expired hold).
        return self.cancel_requested or self.status in TERMINAL_STATUSES

    @property
    def preempt(self) -> bool:
        return self.status == JobStatus.PREEMPTING or self.stopping


@dataclass
class Finish:
    """How an attempt ended, as measured by its runner."""

    exit_class: str
    exit_code: int | None
    gpu_ms: int
    charged: int
    error_message: str = ""
    checkpoint: str = ""
    result_path: str = ""
    resumed_step: int | None = None


def release_gpus(*, of_attempts: Iterable | QuerySet) -> int:
    """Give back every GPU still held by these attempts (ids, or a queryset of attempts):
    the one statement that releases GPUs. Returns how many were released (0 the second
    time); the dispatcher is woken when any were, once the transaction commits."""
    released = GpuAssignment.objects.filter(
        attempt__in=of_attempts, released_at__isnull=True
    ).update(released_at=Now())
    if released:
        wake_dispatcher()
    return released


def end_attempt(
    attempt_id,
    *,
    from_states: Iterable[str],
    exit_class: str,
    error_message: str,
    fencing_token: int | None = None,
    lease_expired: bool = False,
    claimed_by: str | None = None,
    **measured,
) -> bool:
    """Finish the attempt if it is still in one of `from_states` (with this fencing token,
    its lease run out by the database clock when `lease_expired`, claimed by the worker
    named `claimed_by` when given), and release its GPUs. Returns False, changing
    nothing, when the guard finds no row: someone else ended it first. `measured` are the
    runner's final figures (exit_code, gpu_ms, charged, checkpoint_ref). Call inside the
    transaction that holds the attempt's job row."""
    guard = {"pk": attempt_id, "state__in": list(from_states)}
    if fencing_token is not None:
        guard["fencing_token"] = fencing_token
    if lease_expired:
        guard["lease_expires_at__lte"] = Now()
    if claimed_by is not None:
        guard["worker"] = claimed_by
    ended = Attempt.objects.filter(**guard).update(
        state=AttemptState.FINISHED,
        exit_class=exit_class,
        error_message=error_message[:2000],
        finished_at=Now(),
        **measured,
    )
    if ended != 1:
        return False
    release_gpus(of_attempts=[attempt_id])
    return True


def claim_attempt(attempt_id, fencing_token: int, *, worker: str) -> Attempt | None:
    """Make the attempt `running` and its job `running`, or change nothing.

    One transaction: the job row is locked first (the platform's lock order), then one
    guarded UPDATE claims the attempt only if it is still `scheduled` with this fencing
    token and its job is `scheduled`. Returns None for a duplicate, late or stale
    delivery. A scheduled attempt whose job has already left `scheduled` (cancelled
    before it started) is closed and its GPUs given back.
    """
    attempt = Attempt.objects.filter(pk=attempt_id, fencing_token=fencing_token).first()
    if attempt is None:
        return None
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=attempt.job_id)
        lease = timedelta(seconds=settings.GANTRY_LEASE_S)
        claimed = Attempt.objects.filter(
            pk=attempt.pk,
            fencing_token=fencing_token,
            state=AttemptState.SCHEDULED,
            job__status=JobStatus.SCHEDULED,
        ).update(
            state=AttemptState.RUNNING,
            lease_expires_at=Now() + lease,
            started_at=Now(),
            worker=worker[:200],
            checkpoint_ref=job.checkpoint_ref,
        )
        if not claimed:
            if job.status != JobStatus.SCHEDULED:  # cancelled (or ended) before it started
                end_attempt(
                    attempt.pk,
                    from_states=[AttemptState.SCHEDULED],
                    fencing_token=fencing_token,
                    exit_class=ExitClass.KILLED,
                    error_message=f"Never started: the job was {job.status} before it was claimed.",
                )
            return None
        attempt.refresh_from_db()
        running = lifecycle.transition(
            job.pk,
            to=JobStatus.RUNNING,
            reason=f"attempt {attempt.number} started on {attempt.node.name}",
            actor=f"worker:{worker}"[:100],
            only_from=[JobStatus.SCHEDULED],
            attempt=attempt,
            changes={
                "started_at": Coalesce(F("started_at"), Now()),
                "gpu_type": attempt.gpu_type,
            },
        )
        # Every attempt's start, a resume after a preemption or a retry included.
        webhooks.notify(running, event=WebhookEvent.START, attempt=attempt.number)
    metrics.observe_start_wait(
        tier=job.tier, queued_at=job.queued_at, started_at=attempt.started_at
    )
    return attempt


def heartbeat(
    attempt: Attempt,
    *,
    gpu_ms: int,
    charged: int,
    seq: int,
    progress: float | None = None,
    checkpoint: str = "",
    resumed_step: int | None = None,
) -> JobSignal | None:
    """Extend the lease, record usage and progress; None when the attempt was taken away.

    The lease is extended from the database clock; the attempt UPDATE is guarded by the
    fencing token and a live state, so a fenced runner writes nothing. Usage goes to the
    ledger's batched path (Redis) after the commit; losing it loses nothing, since the
    attempt row carries the same figure and the finish reports it again. `resumed_step`
    (sent once, after the generator printed RESUMED) notes the resume in the event log.
    """
    lease = timedelta(seconds=settings.GANTRY_LEASE_S)
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(no_key=True)
            .only(
                "status", "cancel_requested", "progress", "hold_id", "webhook_url", "webhook_events"
            )
            .get(pk=attempt.job_id)
        )
        updates = {
            "lease_expires_at": Now() + lease,
            "gpu_ms": Greatest(F("gpu_ms"), gpu_ms),
            "charged": Greatest(F("charged"), charged),
        }
        if checkpoint:
            updates["checkpoint_ref"] = checkpoint
            updates["checkpointed_at"] = Now()  # preemption victims are scored by it
        alive = Attempt.objects.filter(
            pk=attempt.pk, fencing_token=attempt.fencing_token, state__in=CLAIMED_ATTEMPT_STATES
        ).update(**updates)
        if not alive:
            return None
        job_updates = {}
        if (
            progress is not None
            and progress > job.progress
            and job.status
            in (
                JobStatus.RUNNING,
                JobStatus.PREEMPTING,
            )
        ):
            job_updates["progress"] = min(1.0, progress)
        if checkpoint:
            job_updates["checkpoint_ref"] = checkpoint
        if job_updates and job.status not in TERMINAL_STATUSES:
            Job.objects.filter(pk=job.pk).update(**job_updates)
            if "progress" in job_updates:
                streams.announce_job_changed(job.pk)
                webhooks.notify(job, event=WebhookEvent.PROGRESS)
        if resumed_step is not None:
            lifecycle.record_event(
                job,
                reason=f"attempt {attempt.number} resumed from its checkpoint at step "
                f"{resumed_step}",
                actor=f"worker:{attempt.worker}"[:100],
                data={"attempt": attempt.number, "resumed_step": resumed_step},
            )
        stopping = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.STOPPING).exists()
    if job.hold_id is not None and charged > 0:
        billing.report_usage(job.hold_id, attempt, charged=charged, seq=seq)
    return JobSignal(job.status, job.cancel_requested, stopping)


def finish_attempt(attempt: Attempt, finish: Finish, *, worker: str) -> Job:
    """End the attempt and move its job on, in one transaction; raise Fenced if not ours.

    The job row is locked first, then the attempt is finished by a guarded UPDATE (token
    and live state), its GPUs released and the job transitioned: succeeded, cancelled,
    timed_out, failed, or back to the queue (retry with backoff, or the resume of a
    preemption) with its checkpoint. A terminal transition settles the hold at the usage
    of all attempts, this one at exactly `finish.charged`; a requeue meters it.
    """
    actor = f"worker:{worker}"[:100]
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=attempt.job_id)
        done = end_attempt(
            attempt.pk,
            from_states=CLAIMED_ATTEMPT_STATES,
            fencing_token=attempt.fencing_token,
            exit_class=finish.exit_class,
            error_message=finish.error_message,
            exit_code=finish.exit_code,
            gpu_ms=Greatest(F("gpu_ms"), finish.gpu_ms),
            charged=Greatest(F("charged"), finish.charged),
            checkpoint_ref=finish.checkpoint or F("checkpoint_ref"),
        )
        if not done:
            raise Fenced(f"attempt {attempt.pk} was taken away before it finished")
        attempt.refresh_from_db()
        return outcomes.move_job_on(
            job,
            attempt,
            exit_class=finish.exit_class,
            exit_code=finish.exit_code,
            error_message=finish.error_message,
            checkpoint=finish.checkpoint,
            result_path=finish.result_path,
            resumed_step=finish.resumed_step,
            actor=actor,
        )
