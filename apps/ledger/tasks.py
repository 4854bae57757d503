"""Periodic ledger tasks: thin wrappers over the services, each safe to run twice at once."""

import logging

from celery import shared_task

from apps.core import locks
from apps.ledger import services

logger = logging.getLogger(__name__)


@shared_task(name="gantry.ledger.fold_usage_reports", ignore_result=True)
def fold_usage_reports() -> int:
    """Move batched heartbeat usage from Redis into the ledger (advisory-locked inside)."""
    return services.fold_usage_reports()


@shared_task(name="gantry.ledger.expire_buckets", ignore_result=True)
def expire_buckets() -> int:
    """Expire what is left of buckets past their expiry (SKIP LOCKED, once per bucket)."""
    return services.expire_buckets()


@shared_task(name="gantry.ledger.expire_stale_holds", ignore_result=True)
def expire_stale_holds() -> int:
    """Settle holds whose finish call never came (advisory-locked; each hold once)."""
    return services.expire_stale_holds()


@shared_task(name="gantry.ledger.reconcile", ignore_result=True)
def reconcile() -> int:
    """Check every ledger invariant; report violations as metrics and audit events."""
    with locks.try_session_lock("gantry.ledger.reconcile") as acquired:
        if not acquired:
            return 0
        violations = services.reconcile()
    if violations:
        logger.error(
            "ledger reconciliation found %d violations",
            len(violations),
            extra={"task": "gantry.ledger.reconcile"},
        )
    return len(violations)
