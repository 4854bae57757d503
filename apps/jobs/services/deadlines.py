"""Start deadlines (`start_deadline_s` at submission): a job that never started by its
`start_deadline_at` ends `cancelled` with error code `deadline_exceeded`.

The dispatcher never places such a job (its snapshot leaves it out and a placement
re-checks the deadline under the job's row lock); this sweep ends it. A job that started
once and came back to the queue (preempted, retried) met its deadline and is left alone.
"""

from __future__ import annotations

from datetime import UTC

from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now

from apps.jobs.models import Job, JobStatus
from apps.jobs.services.outcomes import end_job

ACTOR = "deadline"
ERROR_CODE = "deadline_exceeded"

# Whether a job row never started and its start deadline has passed (database clock at
# the statement), as an annotation: what the dispatcher re-checks under the job's row
# lock before it places the job or preempts for it. No deadline (NULL) reads as falsy.
PAST_START_DEADLINE = ExpressionWrapper(
    Q(started_at__isnull=True, start_deadline_at__lte=Now()), output_field=BooleanField()
)


def past_start_deadline():
    """Queued jobs that never started and whose start deadline has passed (database clock)."""
    return Job.objects.filter(
        status=JobStatus.QUEUED,
        started_at__isnull=True,
        start_deadline_at__isnull=False,
        start_deadline_at__lte=Now(),
    )


def cancel_jobs_past_start_deadline(*, limit: int = 500) -> list[str]:
    """Cancel every queued job that never started and is past its start deadline.

    Each job ends in its own transaction through outcomes.end_job: `cancelled`, error
    code `deadline_exceeded`, its hold released in full (no attempt ran, so nothing is
    charged), its webhook queued on commit. Safe to run twice and concurrently: a job is
    locked first (SKIP LOCKED: one that another transaction holds, such as a placement
    in flight, waits for the next run) and re-checked under the lock, so a second run
    finds nothing left. Handles the `limit` most overdue jobs; returns their ids.
    """
    due = list(
        past_start_deadline()
        .order_by("start_deadline_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    return [str(job_id) for job_id in due if cancel_if_past_start_deadline(job_id)]


def cancel_if_past_start_deadline(job_id) -> bool:
    """Cancel one job if it is still queued, never started and past its deadline; False
    (nothing written) otherwise or while another transaction holds its row."""
    with transaction.atomic():
        job = (
            past_start_deadline()
            .select_for_update(skip_locked=True)
            .only("pk", "start_deadline_at")
            .filter(pk=job_id)
            .first()
        )
        if job is None:
            return False
        deadline = job.start_deadline_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        message = (
            f"The job did not start by its start deadline ({deadline}); it was cancelled "
            "and its credit hold released in full (nothing charged)."
        )
        end_job(
            job.pk,
            to=JobStatus.CANCELLED,
            reason=message,
            actor=ACTOR,
            only_from=[JobStatus.QUEUED],
            changes={"error_code": ERROR_CODE, "error_message": message},
            data={"error_code": ERROR_CODE},
        )
    return True
