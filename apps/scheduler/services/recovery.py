"""Putting jobs back in the queue; recovering lost run messages.

For the recovery beat task:

- `requeue_attempt(attempt_id=..., ...)`: end the attempt (attempts.end_attempt, which
  releases its GPUs) and move the job back to queued (outcomes.requeue_job).
- `republish_unclaimed_attempts()`: placed attempts whose worker has not claimed them:
  re-send the run message, or requeue the job once the claim lease has run out.

All are safe to run twice and concurrently: every change is a guarded UPDATE under the
job's row lock, taken first (the platform's lock order).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from apps.jobs.models import (
    UNFINISHED_ATTEMPT_STATES,
    Attempt,
    AttemptState,
    ExitClass,
    Job,
    JobStatus,
)
from apps.jobs.services.attempts import end_attempt, release_gpus
from apps.jobs.services.outcomes import requeue_job
from apps.scheduler.services import metrics
from apps.scheduler.services.decisions import ACTOR
from apps.scheduler.services.dispatch import publish_run_attempt
from apps.scheduler.services.usage import record_attempt_usage

logger = logging.getLogger(__name__)

REQUEUABLE_JOB_STATUSES = (JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.PREEMPTING)
# Unclaimed attempts handled per recovery run (the rest wait for the next run).
BATCH = 500


def requeue_attempt(
    *,
    attempt_id,
    reason: str,
    actor: str,
    exit_class: str = ExitClass.LOST,
    from_attempt_states: Iterable[str] = UNFINISHED_ATTEMPT_STATES,
    only_from: Iterable[str] = REQUEUABLE_JOB_STATUSES,
    lease_expired_only: bool = False,
    job_changes: dict | None = None,
) -> bool:
    """Finish the attempt, release its GPUs and put its job back in the queue.

    One transaction, job row locked first. The attempt is finished only if it is in
    `from_attempt_states` (and, with `lease_expired_only`, its lease has run out by the
    database clock); otherwise nothing changes and False is returned, so a second call
    or a worker that won the race is harmless. The job moves to queued only from
    `only_from` (e.g. [preempting] for a preemption; the caller adds
    `job_changes={"preemption_count": F("preemption_count") + 1, ...}`); a job already
    elsewhere (cancelled, say) keeps its status, but its dead attempt is still finished
    and its GPUs released. GPU time of an attempt that ran is folded into fair-share
    usage after commit.
    """
    job_id = Attempt.objects.filter(pk=attempt_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return False
    with transaction.atomic():
        job = Job.objects.select_for_update().only("id", "status").get(pk=job_id)
        if not end_attempt(
            attempt_id,
            from_states=from_attempt_states,
            lease_expired=lease_expired_only,
            exit_class=exit_class,
            error_message=reason,
        ):
            return False
        if job.status in set(only_from):
            attempt = Attempt.objects.get(pk=attempt_id)
            requeue_job(
                job.pk,
                only_from=only_from,
                reason=reason,
                actor=actor,
                attempt=attempt,
                changes=job_changes,
                data={"attempt": str(attempt_id), "exit_class": exit_class},
            )
        transaction.on_commit(lambda: record_attempt_usage(attempt_id=attempt_id), robust=True)
    return True


@dataclass(frozen=True)
class RecoveryResult:
    republished: int
    requeued: int
    orphans_released: int


def republish_unclaimed_attempts() -> RecoveryResult:
    """Recover placements whose run message may have been lost.

    - An attempt still `scheduled` GANTRY_REPUBLISH_AFTER_S after placement, within its
      claim lease, gets its run message re-sent (a duplicate is harmless: only the
      first claim with the fencing token wins).
    - An attempt still `scheduled` when its claim lease has run out is finished as
      `lost`, its GPUs released, and its job requeued (it never ran, so nothing was
      charged).
    - GPU assignments still live on a finished attempt are released (a runner that died
      between finishing and releasing).
    """
    expired = list(
        Attempt.objects.filter(state=AttemptState.SCHEDULED, lease_expires_at__lte=Now())
        .order_by("lease_expires_at")
        .values_list("id", "node__name")[:BATCH]
    )
    requeued = 0
    for attempt_id, node_name in expired:
        if requeue_attempt(
            attempt_id=attempt_id,
            reason=(
                f"not claimed by a worker of {node_name} within the scheduling lease "
                f"({settings.GANTRY_SCHEDULING_LEASE_S} s); back in the queue"
            ),
            actor=ACTOR,
            exit_class=ExitClass.LOST,
            from_attempt_states=[AttemptState.SCHEDULED],
            only_from=[JobStatus.SCHEDULED],
            lease_expired_only=True,
        ):
            requeued += 1
    stale = list(
        Attempt.objects.filter(
            state=AttemptState.SCHEDULED,
            lease_expires_at__gt=Now(),
            created_at__lte=Now() - timedelta(seconds=settings.GANTRY_REPUBLISH_AFTER_S),
        )
        .order_by("created_at")
        .values_list("id", "fencing_token", "node__name", "job_id", "job__org__name")[:BATCH]
    )
    republished = sum(
        publish_run_attempt(
            attempt_id=attempt_id,
            fencing_token=token,
            node_name=node_name,
            job_id=job_id,
            org_name=org_name,
        )
        for attempt_id, token, node_name, job_id, org_name in stale
    )
    orphans = release_gpus(of_attempts=Attempt.objects.filter(state=AttemptState.FINISHED))
    metrics.RECOVERED.labels("republished").inc(republished)
    metrics.RECOVERED.labels("requeued").inc(requeued)
    if republished or requeued or orphans:
        logger.info(
            "unclaimed attempts: %d run messages re-sent, %d jobs requeued, "
            "%d orphaned GPU assignments released",
            republished,
            requeued,
            orphans,
        )
    return RecoveryResult(republished=republished, requeued=requeued, orphans_released=orphans)
