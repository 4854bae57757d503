"""Control-plane tasks of the jobs app (the GPU pools' tasks are in worker_tasks.py)."""

from celery import shared_task

from apps.jobs.services import deadlines, webhooks


@shared_task(name="gantry.jobs.deliver_webhook", bind=True, max_retries=None, ignore_result=True)
def deliver_webhook(self, job_id: str) -> str:
    """One delivery try of a job's terminal webhook; retried with backoff by the service's
    decision. Safe to run twice: a delivered webhook is recorded and not sent again."""
    outcome = webhooks.deliver_job_webhook(job_id, try_number=self.request.retries + 1)
    if outcome.retry_in is not None:
        raise self.retry(countdown=outcome.retry_in, queue="control")
    return outcome.detail


@shared_task(
    name="gantry.jobs.deliver_webhook_event", bind=True, max_retries=None, ignore_result=True
)
def deliver_webhook_event(self, job_id: str, event: str, attempt: int | None = None) -> str:
    """One best-effort try of a job's start (of `attempt`) or progress webhook; the
    service decides the few quick retries (start only). Safe to run twice: a try already
    made, or a progress delivery within the same second, sends nothing."""
    outcome = webhooks.deliver_job_event(
        job_id, event=event, attempt=attempt, try_number=self.request.retries + 1
    )
    if outcome.retry_in is not None:
        raise self.retry(countdown=outcome.retry_in, queue="control")
    return outcome.detail


@shared_task(name="gantry.jobs.redeliver_webhooks", ignore_result=True)
def redeliver_webhooks() -> int:
    """Queue webhooks whose publish was lost (broker down at commit time)."""
    return webhooks.redeliver_stranded()


@shared_task(name="gantry.jobs.cancel_jobs_past_start_deadline", ignore_result=True)
def cancel_jobs_past_start_deadline() -> int:
    """Cancel (deadline_exceeded, hold released) queued jobs past their start deadline."""
    return len(deadlines.cancel_jobs_past_start_deadline())
