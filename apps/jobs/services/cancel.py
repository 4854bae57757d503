"""Cancelling a job, whatever state it is in."""

from __future__ import annotations

from django.db import transaction

from apps.core.errors import Conflict
from apps.jobs import streams
from apps.jobs.models import Attempt, AttemptState, ExitClass, Job, JobStatus
from apps.jobs.services import stop_requests
from apps.jobs.services.attempts import end_attempt
from apps.jobs.services.lifecycle import record_event
from apps.jobs.services.outcomes import end_job


class JobFinished(Conflict):
    code = "job_finished"


def cancel_job(job_id, *, actor: str, reason: str = "cancelled by the client") -> Job:
    """Cancel the job; returns it as it is now. A finished job raises JobFinished (409).

    - queued: cancelled at once; its hold is released.
    - scheduled: cancelled at once; the attempt is finished (killed), its GPUs are
      released and the hold is released (nothing ran). If the worker claimed the
      attempt meanwhile, this falls through to the running case.
    - running / preempting: `cancel_requested` is set and noted in the event log; the
      job stays running until its worker, told at once (services.stop_requests) and
      reading the flag on every heartbeat regardless, stops the process and finishes
      the job as cancelled, charging the time used. A job that comes back to the queue
      instead is cancelled on arrival (lifecycle).

    Calling it again while a cancel is pending changes nothing. Locks the job row first.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.is_terminal:
            raise JobFinished(f"Job {job.id} already finished ({job.status}).", field="status")
        if job.status == JobStatus.QUEUED:
            return end_job(
                job.id, to=JobStatus.CANCELLED, reason=reason, actor=actor, only_from=[job.status]
            )
        if job.status == JobStatus.SCHEDULED:
            attempt = (
                Attempt.objects.select_for_update()
                .filter(job=job, state=AttemptState.SCHEDULED)
                .order_by("pk")
                .first()
            )
            stopped = attempt is not None and end_attempt(
                attempt.pk,
                from_states=[AttemptState.SCHEDULED],
                exit_class=ExitClass.KILLED,
                error_message="cancelled before it started",
            )
            if stopped:
                return end_job(
                    job.id,
                    to=JobStatus.CANCELLED,
                    reason=reason,
                    actor=actor,
                    only_from=[JobStatus.SCHEDULED],
                    attempt=attempt,
                )
        if not job.cancel_requested:
            Job.objects.filter(pk=job.pk).update(cancel_requested=True)
            streams.announce_job_changed(job.pk)
            stop_requests.announce_stop_requested(job.pk)
            record_event(
                job,
                reason=f"cancel requested ({reason}); the worker stops the run",
                actor=actor,
                data={"cancel_requested": True},
            )
    return Job.objects.select_related("hold").get(pk=job_id)
