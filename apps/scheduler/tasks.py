"""Celery tasks of the scheduler: thin wrappers around one service each, safe to repeat."""

from celery import shared_task

from apps.scheduler.services import dispatch, recovery
from apps.scheduler.services.audit import prune_dispatch_decisions


@shared_task(name="gantry.scheduler.dispatch_tick", ignore_result=True)
def dispatch_tick() -> dict:
    """One dispatch round (if another dispatcher runs one, it is asked for another)."""
    result = dispatch.run_dispatch_tick()
    return {
        "ran": result.ran,
        "placed": result.placed,
        "preempted": result.preempted,
        "skipped": result.skipped,
    }


@shared_task(name="gantry.scheduler.recover_unclaimed_attempts", ignore_result=True)
def recover_unclaimed_attempts() -> dict:
    """Re-send lost run messages; requeue placements never claimed within their lease."""
    result = recovery.republish_unclaimed_attempts()
    return {"republished": result.republished, "requeued": result.requeued}


@shared_task(name="gantry.scheduler.prune_dispatch_decisions", ignore_result=True)
def prune_decisions() -> int:
    """Delete audit rows older than GANTRY_DISPATCH_DECISION_RETENTION_DAYS."""
    return prune_dispatch_decisions()
