"""Job submission: validate the spec, hold credit, create the queued job, all or nothing.

Admission runs in this order (submit_api_request from the API, after the view's auth):
rate limit / overload (services.admission, Redis-side) → validation → [one transaction:
idempotency lock and replay → quarantine (422) → dedup → queue quota → credit hold
(ledger.reserve) → Job(queued) + JobEvent] → on commit: wake the dispatcher.

The hot path is seven statements in three PostgreSQL round trips: BEGIN (psycopg waits
for it, pipeline or not); the idempotency lock and every admission read; then the
ledger's budget lock and reservation, the INSERT of the job and its event, and COMMIT.
The reservation has no savepoint of its own (a refusal fails the submission anyway);
when its lanes cannot serve it, or it went without the budgets' part to an org that has
budgets, the whole transaction runs again (ledger.ReservationRetry).

Idempotency: the Idempotency-Key is scoped to the org, or to the project of a
project-bound API key. Concurrent submissions with one
key serialise on a transaction-scoped advisory lock; the first creates the job and its
hold, the others find the job and answer it again (same id, its current state). The
same key with a different request body is a 409. Credits are never held twice for one
key: the hold is made in the transaction that inserts the job, and the job's key is
unique per org (the lock is what lets a concurrent duplicate answer the first job
instead of failing on that key). The hold's own
idempotency key is its job's id, time-ordered like the id (apps.core.ids), so it lands
at the right edge of the org's part of the holds' key index.
A submission that fails (402, 403, 429...) leaves nothing behind and may be retried
with the same key.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from apps.accounts import selectors as accounts
from apps.accounts.models import APIKey, Org, Project, User
from apps.core.errors import Conflict
from apps.core.ids import new_id
from apps.core.logging import current_request_id
from apps.core.sql import NowPlus, insert_statement, mark_inserted
from apps.core.wakeup import wake_dispatcher
from apps.fleet.selectors import GpuTypeInfo
from apps.jobs import selectors
from apps.jobs.models import DEFAULT_WEBHOOK_EVENTS, Job, JobEvent, JobStatus, WebhookEvent
from apps.jobs.services import admission, lifecycle, webhooks
from apps.jobs.services.params_schema import check_params
from apps.jobs.services.spec import (
    JobSpec,
    fingerprint_of,
    hold_amount,
    request_digest_of,
    spec_of,
    validate_spec,
)
from apps.jobs.validation import validate_submit_body
from apps.ledger import services as ledger


@dataclass(frozen=True)
class Submission:
    job: Job
    replayed: bool = False
    deduplicated: bool = False
    allowed_types: list[GpuTypeInfo] = field(default_factory=list)


def scoped_idempotency_key(idempotency_key: str, *, project_id) -> str:
    """The key as stored: a project-bound API key's keys live in its project's space, so
    the same Idempotency-Key sent with another project's key is a new request (and can
    never replay, or learn of, that project's job)."""
    return f"project:{project_id}:{idempotency_key}" if project_id else idempotency_key


def submit_api_request(*, api_key: APIKey, body, idempotency_key: str) -> Submission:
    """POST /v1/jobs for an org key: rate limits, the body checked (400 naming the
    field), its project resolved (a key narrowed to a project submits only there), then
    submit_job with the body's digest, so the same key and body replay the same job."""
    org = api_key.org
    queued_estimate = admission.admit(org)
    data = validate_submit_body(body)
    check_params(data["params"])
    resources = data.get("resources") or {}
    spec = JobSpec(
        params=data["params"],
        max_runtime_s=data["max_runtime_s"],
        gpu_count=resources.get("gpu_count", 1),
        gpu_types=tuple(dict.fromkeys(resources.get("gpu_types") or ())),
        min_gpu_memory_gb=resources.get("min_gpu_memory_gb", 0),
        preemptible=data["preemptible"],
        webhook_url=data.get("webhook_url", ""),
        webhook_events=tuple(data.get("webhook_events", DEFAULT_WEBHOOK_EVENTS)),
        start_deadline_s=data.get("start_deadline_s"),
    )
    project = accounts.resolve_project(org, data.get("project"), key_project=api_key.project)
    return submit_job(
        org=org,
        project=project,
        user=api_key.user,
        spec=spec,
        idempotency_key=scoped_idempotency_key(idempotency_key, project_id=api_key.project_id),
        request_digest=request_digest_of(body),
        actor=f"api:{api_key.prefix}",
        queued_estimate=queued_estimate,
    )


def submit_job(
    *,
    org: Org,
    project: Project,
    spec: JobSpec,
    user: User | None = None,
    idempotency_key: str | None = None,
    request_digest: str = "",
    actor: str = "api",
    reason: str = "submitted",
    enforce_quota: bool = True,
    allow_dedup: bool = True,
    queued_estimate: int | None = None,
) -> Submission:
    """Admit one job: validated, quota-checked, credit held, queued, in one transaction.

    Guarantees: either the job exists queued with an active hold and a `queued` event,
    or nothing was written (the error says why: 400, 402, 403, 409, 422, 429). The same
    `idempotency_key` returns the same job (`replayed`) and never holds twice; with a
    different `request_digest` it is a 409. With the org's dedup on, an identical spec
    returns a new job that is already succeeded and reuses the earlier result, with no
    hold and no charge (`deduplicated`). With `spec.start_deadline_s`, the job's
    start_deadline_at is the database clock at the insert plus those seconds (see
    services.deadlines). Rate limits are the caller's (admission.admit), and so is
    `queued_estimate`, the org's queued jobs as admission estimates them: far below the
    quota the queue is not counted (admission.far_below_quota).
    """
    allowed = validate_spec(spec, tier=org.tier)
    admit = functools.partial(
        _admit,
        org=org,
        project=project,
        spec=spec,
        user=user,
        key=idempotency_key or f"internal:{new_id()}",
        request_digest=request_digest,
        actor=actor,
        reason=reason,
        enforce_quota=enforce_quota,
        allow_dedup=allow_dedup,
        allowed=allowed,
        queued_estimate=queued_estimate,
    )
    for attempt in range(RESERVATION_ATTEMPTS):
        try:
            submission = admit()
            break
        except ledger.ReservationRetry:
            # Rolled back whole; the org's next reservation is sent as this one asked.
            if attempt + 1 == RESERVATION_ATTEMPTS:
                raise
    job = submission.job
    if submission.replayed or submission.deduplicated:
        return submission
    if spec.start_deadline_s is not None:
        # The database computed the deadline at the insert: read it back for the answer
        # (one primary-key read, only for a submission that set one).
        job.start_deadline_at = (
            Job.objects.filter(pk=job.id).values_list("start_deadline_at", flat=True).get()
        )
    return submission


# A reservation that could not be made as sent asks for the transaction again: sent
# without the budgets' part for an org that has budgets (then with them), and sent to
# lanes that could not serve it (then to every lane), at most once each.
RESERVATION_ATTEMPTS = 3


def _admit(
    *,
    org: Org,
    project: Project,
    spec: JobSpec,
    user: User | None,
    key: str,
    request_digest: str,
    actor: str,
    reason: str,
    enforce_quota: bool,
    allow_dedup: bool,
    allowed: list[GpuTypeInfo],
    queued_estimate: int | None,
) -> Submission:
    """submit_job's transaction: the admission checks, the hold and the job."""
    fingerprint = fingerprint_of(spec)
    counts = enforce_quota and not admission.far_below_quota(org, queued_estimate)
    with transaction.atomic():
        quota = admission.org_limits(org).max_queued if counts else 0
        snapshot = admission.lock_and_read(org.id, key, fingerprint, up_to=quota)
        if snapshot.existing_job_id is not None:
            existing = Job.objects.select_related("hold").get(pk=snapshot.existing_job_id)
            if existing.request_digest != request_digest:
                raise Conflict(
                    "This Idempotency-Key was used with a different request body.",
                    code="idempotency_mismatch",
                    field="Idempotency-Key",
                )
            return Submission(job=existing, replayed=True, allowed_types=allowed)
        if snapshot.quarantined:
            raise admission.quarantine_error()

        common = {
            "org": org,
            "project": project,
            "user": user,
            "tier": org.tier,
            "params": spec.params,
            "gpu_count": spec.gpu_count,
            "gpu_types": list(spec.gpu_types),
            "min_gpu_memory_gb": spec.min_gpu_memory_gb,
            "max_runtime_s": spec.max_runtime_s,
            "preemptible": spec.preemptible,
            "webhook_url": spec.webhook_url,
            "webhook_events": list(spec.webhook_events),
            "fingerprint": fingerprint,
            "idempotency_key": key,
            "request_digest": request_digest,
            "queued_at": Now(),
            # The database clock at the insert, like queued_at: submission + the seconds.
            "start_deadline_at": (
                NowPlus(timedelta(seconds=spec.start_deadline_s))
                if spec.start_deadline_s is not None
                else None
            ),
        }
        if allow_dedup and org.dedup_enabled:
            source = selectors.dedup_source(org.id, fingerprint)
            if source is not None:
                job = _create_deduplicated(common, source=source, actor=actor)
                return Submission(job=job, deduplicated=True, allowed_types=allowed)

        if counts:
            admission.check_queue_quota(org, queued=snapshot.queued)
            if queued_estimate is None:  # start the estimate from this exact count
                transaction.on_commit(
                    functools.partial(admission.remember_queued, org.id, snapshot.queued + 1)
                )
        job_id, hold_id = new_id(), new_id()
        amount = hold_amount(spec, allowed)
        job = Job(id=job_id, status=JobStatus.QUEUED, hold_id=hold_id, **common)
        event = JobEvent(
            job=job,
            from_status="",
            to_status=JobStatus.QUEUED,
            reason=reason,
            actor=actor,
            data={"hold": str(hold_id), "amount": amount, **_request_of_submission()},
        )
        wake_dispatcher()  # on commit
        # One round trip holds the credit, inserts the job and its event, and commits:
        # the reservation locked the org's credit buckets, so they stay locked only while
        # it runs and commits. It has no savepoint: a refusal (402, 403) fails the whole
        # submission anyway. Nothing may follow it in this block.
        job.hold = ledger.reserve(
            org=org,
            amount=amount,
            idempotency_key=f"job:{job_id}",
            project=project,
            user=user,
            job_id=job_id,
            hold_id=hold_id,
            # Recovery may reclaim the hold only after the job could have waited in the
            # queue and then run for its whole max runtime.
            expires_at=timezone.now()
            + timedelta(seconds=spec.max_runtime_s + settings.GANTRY_HOLD_QUEUE_ALLOWANCE_S),
            savepoint=False,
            then=(insert_statement(job, event),),
            last=True,
        )
        mark_inserted(job, event)
    return Submission(job=job, allowed_types=allowed)


def _request_of_submission() -> dict:
    """{"request_id": X-Request-Id} of the submitting request, kept with the job so that
    the log lines of its runs name it (apps.core.logging)."""
    request_id = current_request_id()
    return {"request_id": request_id} if request_id else {}


def _create_deduplicated(common: dict, *, source: Job, actor: str) -> Job:
    """A new job, already succeeded, returning `source`'s result; nothing is held."""
    original_id = source.reused_from_id or source.id
    job = Job.objects.create(
        status=JobStatus.SUCCEEDED,
        reused_from_id=original_id,
        result_path=source.result_path,
        gpu_type=source.gpu_type,
        progress=1.0,
        finished_at=Now(),
        **common,
    )
    JobEvent.objects.create(
        job=job,
        from_status="",
        to_status=JobStatus.SUCCEEDED,
        reason=f"deduplicated: identical to job {original_id}, whose result is reused (no charge)",
        actor=actor,
        data={
            "reused_from": str(original_id),
            # The earlier job may be another project's: the tenant reads no id.
            lifecycle.PUBLIC_REASON: "deduplicated: identical to an earlier job, "
            "whose result is reused (no charge)",
        },
    )
    webhooks.notify(job, event=WebhookEvent.COMPLETED)
    job.refresh_from_db()
    return job


def requeue_failed_job(job_id, *, actor: str) -> Job:
    """Run a dead-lettered (failed) job again as a NEW job with a fresh hold.

    The state machine keeps `failed` final (its hold is settled; its history stays as
    it was), so a requeue is a copy: same org, project, user and spec, linked both ways
    in the event logs. Requeuing the same job twice returns the same copy. Quotas do
    not apply (an operator decided); credits, budgets and quarantine do.
    """
    original = Job.objects.select_related("org", "project", "user").get(pk=job_id)
    if original.status != JobStatus.FAILED:
        raise Conflict(
            f"Job {original.id} is {original.status}; only a failed (dead-lettered) job "
            "can be requeued.",
            code="not_dead_lettered",
            field="status",
        )
    with transaction.atomic():
        submission = submit_job(
            org=original.org,
            project=original.project,
            user=original.user,
            spec=spec_of(original),
            idempotency_key=f"gantry-requeue:{original.id}",
            request_digest=f"requeue:{original.id}",
            actor=actor,
            reason=f"requeued copy of dead-lettered job {original.id}",
            enforce_quota=False,
            allow_dedup=False,
        )
        if not submission.replayed:
            lifecycle.record_event(
                original,
                reason=f"requeued as job {submission.job.id}",
                actor=actor,
                data={"requeued_as": str(submission.job.id)},
            )
    return submission.job
