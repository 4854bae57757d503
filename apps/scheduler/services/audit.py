"""The dispatch audit trail's upkeep."""

from datetime import timedelta

from django.conf import settings
from django.db.models.functions import Now

from apps.scheduler.models import DispatchDecision, RecordedAttemptUsage


def prune_dispatch_decisions() -> int:
    """Delete DispatchDecision (and usage-recorded marker) rows older than the retention.

    Markers older than the retention can go: an attempt is recorded when it finishes, so
    one that old will not be recorded again. Returns the decisions deleted."""
    cutoff = Now() - timedelta(days=settings.GANTRY_DISPATCH_DECISION_RETENTION_DAYS)
    deleted, _ = DispatchDecision.objects.filter(at__lt=cutoff).delete()
    RecordedAttemptUsage.objects.filter(recorded_at__lt=cutoff).delete()
    return deleted
