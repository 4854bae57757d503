"""Celery tasks of the GPU worker pools (run) and of recovery (beat, control queue).

`gantry.jobs.run_attempt` is published by the dispatcher to the queue of the node the
attempt was placed on ("node.<name>"), once its transaction commits. The run may take
many minutes: it is acked late, has no time limit (the runner enforces max_runtime_s)
and never relies on the broker to detect a dead worker: the attempt's lease in
PostgreSQL does, and the fencing token makes a redelivered copy exit without a write.
"""

from celery import shared_task
from celery.signals import worker_shutting_down

from apps.jobs.services import recovery, runner


@shared_task(
    name="gantry.jobs.run_attempt",
    bind=True,
    acks_late=True,
    ignore_result=True,
    time_limit=None,
    soft_time_limit=None,
    max_retries=0,
)
def run_attempt(self, attempt_id: str, fencing_token: int) -> str:
    """Run one attempt to its end; a duplicate or stale delivery changes nothing."""
    outcome = runner.run_attempt(attempt_id, int(fencing_token), worker=self.request.hostname or "")
    if not outcome.claimed:
        return "not claimed"
    return "fenced" if outcome.fenced else f"{outcome.exit_class} → {outcome.job_status}"


@shared_task(name="gantry.jobs.reap_expired_leases", ignore_result=True)
def reap_expired_leases() -> int:
    """Requeue (or dead-letter) the jobs of attempts whose worker stopped heartbeating."""
    return len(recovery.reap_expired_leases())


@shared_task(name="gantry.jobs.close_stranded_holds", ignore_result=True)
def close_stranded_holds() -> int:
    """Settle or release holds whose job finished without closing them."""
    return recovery.close_stranded_holds()


@worker_shutting_down.connect
def hand_back_running_jobs(**kwargs) -> None:
    """A worker asked to stop (deploy, Ctrl-C) checkpoints its runs and requeues their
    jobs now, rather than leaving them to be found by the lease reaper."""
    runner.request_drain()
