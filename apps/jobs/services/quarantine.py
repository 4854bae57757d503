"""Poison containment: params that hang or crash the generator on several nodes.

A params fingerprint (Job.fingerprint) whose attempts hung or crashed on
GANTRY_QUARANTINE_NODES different nodes is quarantined: submissions with it are refused
(the jobs API checks `is_quarantined`), and the job that tripped it fails instead of
retrying. Operators see the rows in the admin and clear them with `clear_quarantine`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction

from apps.jobs.models import Attempt, ExitClass, Job, QuarantinedFingerprint

POISON_EXITS = (ExitClass.CRASHED, ExitClass.HUNG)


def poisoned_node_count(fingerprint: str) -> int:
    """How many different nodes attempts with this fingerprint hung or crashed on."""
    return (
        Attempt.objects.filter(job__fingerprint=fingerprint, exit_class__in=POISON_EXITS)
        .values("node_id")
        .distinct()
        .count()
    )


def is_quarantined(fingerprint: str) -> bool:
    return bool(fingerprint) and QuarantinedFingerprint.objects.filter(pk=fingerprint).exists()


def quarantine_if_poisonous(job: Job) -> QuarantinedFingerprint | None:
    """Quarantine the job's fingerprint once it hung or crashed on K nodes; return the row.

    Returns the existing row if the fingerprint is already quarantined, None if it is
    below the threshold (K = GANTRY_QUARANTINE_NODES). Safe to call concurrently: two
    callers crossing the threshold together create one row.
    """
    if not job.fingerprint:
        return None
    existing = QuarantinedFingerprint.objects.filter(pk=job.fingerprint).first()
    if existing is not None:
        return existing
    nodes = poisoned_node_count(job.fingerprint)
    if nodes < settings.GANTRY_QUARANTINE_NODES:
        return None
    try:
        with transaction.atomic():
            return QuarantinedFingerprint.objects.create(
                fingerprint=job.fingerprint,
                reason=(
                    f"Jobs with these params hung or crashed on {nodes} different nodes "
                    f"(threshold {settings.GANTRY_QUARANTINE_NODES})."
                ),
                node_count=nodes,
                sample_job=job,
            )
    except IntegrityError:  # a concurrent caller quarantined it first
        return QuarantinedFingerprint.objects.get(pk=job.fingerprint)


def clear_quarantine(fingerprint: str) -> bool:
    """Allow the fingerprint again (an operator fixed the cause). True if it was quarantined.

    Earlier failures are not forgotten: one more hang or crash quarantines it again.
    """
    deleted, _ = QuarantinedFingerprint.objects.filter(pk=fingerprint).delete()
    return deleted > 0
