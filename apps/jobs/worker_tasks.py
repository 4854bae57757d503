"""Celery tasks of the GPU worker pools (run) and of recovery (beat, control queue).

`gantry.jobs.run_attempt` is published by the dispatcher to the queue of the node the
attempt was placed on ("node.<name>"), once its transaction commits. The run may take
many minutes: it is acked late, has no time limit (the runner enforces max_runtime_s)
and never relies on the broker to detect a dead worker: the attempt's lease in
PostgreSQL does, and the fencing token makes a redelivered copy exit without a write.
"""

import logging

from celery import shared_task
from celery.signals import worker_init, worker_shutting_down
from django.db import DatabaseError, connections

from apps.jobs.models import ExitClass
from apps.jobs.services import recovery, runner

logger = logging.getLogger(__name__)


class AttemptFailed(Exception):
    """The attempt ended badly; the message says how and what became of its job.

    Raised after everything is recorded, so that the task's state says how the attempt
    ended (Flower shows FAILURE, not SUCCESS, for a crash); declared in `throws`, so
    Celery logs it as an expected outcome without a traceback, and acks the message."""


# Exit classes that fail the task; a success, a preemption or a cancel do not.
FAILED_EXITS = frozenset(
    (
        ExitClass.CRASHED,
        ExitClass.OOM,
        ExitClass.HUNG,
        ExitClass.TIMED_OUT,
        ExitClass.BAD_INPUT,
        ExitClass.NODE_FAULT,
        ExitClass.LOST,
    )
)


@shared_task(
    name="gantry.jobs.run_attempt",
    bind=True,
    acks_late=True,
    ignore_result=True,
    time_limit=None,
    soft_time_limit=None,
    max_retries=0,
    throws=(AttemptFailed,),
)
def run_attempt(self, attempt_id: str, fencing_token: int, job: str = "", org: str = "") -> str:
    """Run one attempt to its end; a duplicate or stale delivery changes nothing.
    `job` and `org` only name the work for whoever watches the queue (Flower)."""
    outcome = runner.run_attempt(attempt_id, int(fencing_token), worker=self.request.hostname or "")
    if not outcome.claimed:
        return "not claimed"  # a duplicate or stale delivery
    if outcome.fenced:
        return "fenced"  # the attempt was taken away
    summary = (
        f"attempt ended {outcome.exit_class} (exit {outcome.exit_code}); "
        f"job {job or '?'} of {org or '?'} is {outcome.job_status}"
    )
    if outcome.exit_class in FAILED_EXITS:
        raise AttemptFailed(summary)
    return summary


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


@worker_init.connect
def reap_what_a_previous_process_held(sender=None, **kwargs) -> None:
    """A worker starting up (its supervisor restarted it after a kill, a crash, a
    reboot) ends the attempts its previous process still held under its name, before
    it takes a message: their jobs go back to the queue at once, not a lease later.
    Without the database now, the lease reaper finds them as before."""
    name = getattr(sender, "hostname", "") or ""
    if not name:
        return
    try:
        reaped = recovery.reap_attempts_of_restarted_worker(worker=name)
    except DatabaseError:
        logger.warning("could not look for attempts of %s's previous process", name, exc_info=True)
        return
    finally:
        connections.close_all()  # this thread runs no task; its connection would idle
    if reaped:
        logger.warning(
            "%s restarted: %d attempt(s) of its previous process ended", name, len(reaped)
        )
