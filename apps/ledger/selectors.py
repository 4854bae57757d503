"""Reads of the ledger, scoped to what the caller may see."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q, QuerySet

from apps.ledger.allocation import burn_key
from apps.ledger.models import Bucket, BucketKind, Entry
from apps.ledger.services._store import db_now

EXPIRING_SOON = timedelta(days=7)


def balance(*, org, project=None) -> dict:
    """What the org (or a job of `project`) can spend now, by the database clock.

    available: spendable now (unexpired buckets); held: reserved by active holds;
    total = available + held. Buckets are listed in burn order; `expiring_soon` are
    those with credit left that expire within 7 days.
    """
    now = db_now()
    buckets = Bucket.objects.filter(org=org)
    if project is not None:
        buckets = buckets.filter(Q(project__isnull=True) | Q(project=project))
    by_kind = dict.fromkeys(BucketKind.values, 0)
    listed, expiring = [], []
    available = held = 0
    rows = sorted(
        buckets.filter(Q(held__gt=0) | Q(expired_at__isnull=True)),
        key=lambda b: burn_key(
            expires_at=b.expires_at, kind=b.kind, created_at=b.created_at, bucket_id=b.pk
        ),
    )
    for bucket in rows:
        live = bucket.expires_at is None or bucket.expires_at > now
        remaining = bucket.remaining if live else 0
        if remaining <= 0 and bucket.held <= 0:
            continue
        available += remaining
        held += bucket.held
        by_kind[bucket.kind] += remaining
        listed.append({"bucket": bucket, "remaining": remaining})
        if (
            remaining > 0
            and bucket.expires_at is not None
            and bucket.expires_at - now <= (EXPIRING_SOON)
        ):
            expiring.append({"bucket": bucket, "remaining": remaining})
    return {
        "org": org,
        "project": project,
        "available": available,
        "held": held,
        "total": available + held,
        "by_kind": by_kind,
        "buckets": listed,
        "expiring_soon": expiring,
        "as_of": now,
    }


def entries_of(*, org, job=None) -> QuerySet[Entry]:
    """The org's entries, optionally those of one job (tagged directly or via its hold)."""
    entries = Entry.objects.filter(org=org)
    if job is not None:
        entries = entries.filter(Q(job_id=job) | Q(hold__job_ref=job))
    return entries


def buckets_of(*, org) -> QuerySet[Bucket]:
    return Bucket.objects.filter(org=org)
