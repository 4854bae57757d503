"""Reads of the ledger, scoped to what the caller may see."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Now, TruncMonth

from apps.core.clock import db_now
from apps.ledger.allocation import burn_key
from apps.ledger.models import Bucket, BucketKind, Budget, Entry

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
    available = held = 0
    rows = sorted(
        buckets.filter(Q(held__gt=0) | Q(expired_at__isnull=True)),
        key=lambda b: burn_key(
            expires_at=b.expires_at, kind=b.kind, created_at=b.created_at, bucket_id=b.grant_id
        ),
    )
    grants: dict = {}  # a grant's lanes add up to one listed bucket
    for bucket in rows:
        live = bucket.expires_at is None or bucket.expires_at > now
        remaining = bucket.remaining if live else 0
        if remaining <= 0 and bucket.held <= 0:
            continue
        available += remaining
        held += bucket.held
        by_kind[bucket.kind] += remaining
        listed = grants.setdefault(
            bucket.grant_id, {"id": bucket.grant_id, "bucket": bucket, "remaining": 0, "held": 0}
        )
        listed["remaining"] += remaining
        listed["held"] += bucket.held
    listed = list(grants.values())
    expiring = [
        item
        for item in listed
        if item["remaining"] > 0
        and item["bucket"].expires_at is not None
        and item["bucket"].expires_at - now <= EXPIRING_SOON
    ]
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


def entries_of(*, org, job=None, project_id=None) -> QuerySet[Entry]:
    """The org's entries, optionally those of one job (tagged directly or via its hold);
    with `project_id`, only that project's: of its holds and its project-bound buckets.

    Each carries `grant_id`: its bucket as tenants see it (a grant's first lane)."""
    entries = Entry.objects.filter(org=org).annotate(
        grant_id=Coalesce(F("bucket__lane_of_id"), F("bucket_id"))
    )
    if job is not None:
        entries = entries.filter(Q(job_id=job) | Q(hold__job_ref=job))
    if project_id is not None:
        entries = entries.filter(Q(hold__project_id=project_id) | Q(bucket__project_id=project_id))
    return entries


def buckets_of(*, org) -> QuerySet[Bucket]:
    return Bucket.objects.filter(org=org)


@dataclass(frozen=True)
class GrantTotals:
    """A grant as tenants see it: its lanes added up, under the first lane's id."""

    id: uuid.UUID
    org_id: uuid.UUID
    project_id: uuid.UUID | None
    kind: str
    granted: int
    held: int
    consumed: int
    expired: int
    expires_at: datetime | None
    created_at: datetime
    lanes: int

    @property
    def remaining(self) -> int:
        return self.granted - self.consumed - self.held - self.expired


def grant_totals(bucket: Bucket) -> GrantTotals:
    """The grant that `bucket` (any of its lanes) belongs to, its lanes added up."""
    first_id = bucket.grant_id
    sums = Bucket.objects.filter(Q(pk=first_id) | Q(lane_of_id=first_id)).aggregate(
        granted=Sum("granted"),
        held=Sum("held"),
        consumed=Sum("consumed"),
        expired=Sum("expired"),
        lanes=Count("pk"),
    )
    return GrantTotals(
        id=first_id,
        org_id=bucket.org_id,
        project_id=bucket.project_id,
        kind=bucket.kind,
        expires_at=bucket.expires_at,
        created_at=bucket.created_at,
        **sums,
    )


def budget_usage(budget: Budget) -> tuple[int, int]:
    """(held, consumed) of a budget: the sums over its lanes (Budget.lane_of), consumed
    counting only the current month of a month budget (database clock), in one query."""
    first_id = budget.lane_of_id or budget.pk
    sums = Budget.objects.filter(Q(pk=first_id) | Q(lane_of_id=first_id)).aggregate(**_usage_sums())
    return sums["held"], sums["consumed"]


def with_budget_usage(budgets: QuerySet[Budget]) -> QuerySet[Budget]:
    """`budgets` (first lanes) with `usage_held` and `usage_consumed`: budget_usage of
    each row, read in the same query (a page of budgets, one query)."""
    lanes = (
        Budget.objects.filter(Q(pk=OuterRef("pk")) | Q(lane_of_id=OuterRef("pk")))
        .order_by()
        .annotate(one=Value(1))
        .values("one")  # one group: the lanes of the outer row
    )
    return budgets.annotate(
        **{
            f"usage_{name}": Coalesce(Subquery(lanes.annotate(total=total).values("total")), 0)
            for name, total in _usage_sums().items()
        }
    )


def _usage_sums() -> dict:
    this_month = TruncMonth(Now(), tzinfo=UTC)
    stale = Q(period="month", period_start__lt=this_month)
    return {
        "held": Sum("held", default=0),
        "consumed": Sum(
            Case(When(stale, then=0), default=F("consumed"), output_field=BigIntegerField()),
            default=0,
        ),
    }


def budgets_of(*, org) -> QuerySet[Budget]:
    """The org's budgets, each as its first lane."""
    return Budget.objects.filter(org=org, lane_of__isnull=True)
