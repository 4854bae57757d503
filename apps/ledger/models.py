"""The credit ledger: buckets of credit, holds against them, and append-only entries.

All amounts are integer micro-credits. Money only moves through apps.ledger.services;
the cached columns below are updated in the same transaction as the entries that
justify them, and the CHECK constraints make an overdraft impossible even for a buggy
caller. The reconciler (services.reconcile) replays the entries against every cache.

Accounts (Entry.account) are per bucket:

    issued     the source of the bucket's credit (only ever negative)
    available  spendable
    held       reserved by an active hold, not yet used
    captured   used by an active hold (metered), not yet settled
    consumed   final spend of settled holds
    expired    what expiry took

Bucket.held caches held + captured; Bucket.consumed and Bucket.expired cache their
accounts; granted = -issued; available = granted - consumed - held - expired.
"""

from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Now

from apps.accounts.models import Org, Project, User
from apps.core.ids import new_id
from apps.ledger.allocation import KIND_RANK


class BucketKind(models.TextChoices):
    PAID = "paid", "Paid (purchase)"
    PROMO = "promo", "Promotion"
    GRANT = "grant", "Grant"


# Burn order on a tie of expires_at: promotional first, then grants, then paid credit
# (KIND_RANK, defined with the rest of the burn order in apps.ledger.allocation).


class Bucket(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # Few indexes on the rows every reserve and settle writes: each costs index
    # maintenance and a relation lock, and PostgreSQL keeps only 16 relation locks per
    # transaction off its shared lock table. The org is indexed by bucket_org_expiry;
    # a project's buckets are found through its org (deleting a project, rare, scans).
    org = models.ForeignKey(
        Org, on_delete=models.PROTECT, related_name="credit_buckets", db_index=False
    )
    project = models.ForeignKey(
        Project,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="credit_buckets",
        db_index=False,
        help_text="Only holds of this project may draw from it; empty: the whole org.",
    )
    kind = models.CharField(max_length=8, choices=BucketKind.choices)
    kind_rank = models.GeneratedField(
        expression=Case(
            When(kind=BucketKind.PROMO, then=Value(KIND_RANK[BucketKind.PROMO])),
            When(kind=BucketKind.GRANT, then=Value(KIND_RANK[BucketKind.GRANT])),
            default=Value(KIND_RANK[BucketKind.PAID]),
        ),
        output_field=models.SmallIntegerField(),
        db_persist=True,
    )
    granted = models.BigIntegerField()
    consumed = models.BigIntegerField(default=0)
    held = models.BigIntegerField(default=0, help_text="Held or captured by active holds.")
    expired = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(
        null=True, blank=True, help_text="When expiry took what was left (database clock)."
    )
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    actor = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # A large grant is issued as several lanes: bucket rows of one rank (same kind,
    # expiry, scope and created_at) that concurrent holds draw from side by side, so
    # that one busy org does not queue on one row (services.buckets.grant). The first
    # lane (lane 0) is the grant's bucket and carries its idempotency key; the others
    # point to it. Tenants see a grant as one bucket.
    lane_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="lanes",
        db_index=False,
        help_text="The grant's first bucket, for its other lanes; empty for the first.",
    )
    lane = models.SmallIntegerField(default=0, db_default=0)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = [
            models.Index(fields=["org", "expires_at"], name="bucket_org_expiry"),
            models.Index(
                fields=["expires_at"],
                name="bucket_expiry_pending",
                condition=Q(expires_at__isnull=False, expired_at__isnull=True),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["org", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="bucket_idempotency_key_per_org",
            ),
            models.CheckConstraint(condition=Q(granted__gte=0), name="bucket_granted_nonnegative"),
            models.CheckConstraint(
                condition=Q(consumed__gte=0, held__gte=0, expired__gte=0),
                name="bucket_parts_nonnegative",
            ),
            models.CheckConstraint(
                condition=Q(granted__gte=F("consumed") + F("held") + F("expired")),
                name="bucket_never_overdrawn",
            ),
            models.CheckConstraint(
                condition=Q(kind__in=BucketKind.values), name="bucket_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(lane_of__isnull=True, lane=0) | Q(lane_of__isnull=False, lane__gt=0),
                name="bucket_lane_valid",
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.granted} µc ({self.org_id})"

    @property
    def grant_id(self):
        """The bucket tenants see: the grant's first lane."""
        return self.lane_of_id or self.pk

    @property
    def remaining(self) -> int:
        """Not consumed, held or expired. Spendable only while unexpired (database clock)."""
        return self.granted - self.consumed - self.held - self.expired


class HoldState(models.TextChoices):
    ACTIVE = "active", "Active"
    SETTLED = "settled", "Settled"
    RELEASED = "released", "Released"
    EXPIRED = "expired", "Expired (recovered)"


class Hold(models.Model):
    """Credit reserved for one job, captured as it is used, settled exactly once."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    org = models.ForeignKey(
        Org, on_delete=models.PROTECT, related_name="credit_holds", db_index=False
    )  # indexed by the (org, idempotency_key) constraint
    # Not indexed (see Bucket.org): a scope's holds are found through the org.
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    user = models.ForeignKey(
        User, null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # A plain id, not a foreign key: the jobs app depends on the ledger, not the reverse.
    job_ref = models.UUIDField(null=True, blank=True, db_index=True)
    requested_amount = models.BigIntegerField(help_text="The amount of the reserve call.")
    amount = models.BigIntegerField(help_text="Reserved in total (requested + extensions).")
    captured = models.BigIntegerField(default=0)
    refunded = models.BigIntegerField(default=0)
    usage = models.BigIntegerField(
        default=0, help_text="Reported usage: the sum over attempts of their largest report."
    )
    state = models.CharField(max_length=10, choices=HoldState.choices, default=HoldState.ACTIVE)
    idempotency_key = models.CharField(max_length=255)
    expires_at = models.DateTimeField(
        help_text="After this the recovery task settles the hold at its metered usage."
    )
    metered_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # The reserving session's lane number (services.holds.preferred_lane): the lane of
    # each grant and budget it prefers (lane % the lanes there are), kept so that its
    # settlement discharges the budget lane it charged.
    lane = models.IntegerField(default=0, db_default=0)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = [
            models.Index(
                fields=["expires_at"],
                name="hold_active_expiry",
                condition=Q(state="active"),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["org", "idempotency_key"], name="hold_idempotency_key_per_org"
            ),
            models.CheckConstraint(
                condition=Q(
                    amount__gt=0, requested_amount__gt=0, amount__gte=F("requested_amount")
                ),
                name="hold_amount_positive",
            ),
            models.CheckConstraint(
                condition=Q(captured__gte=0, refunded__gte=0, usage__gte=0),
                name="hold_parts_nonnegative",
            ),
            models.CheckConstraint(
                condition=Q(amount__gte=F("captured") + F("refunded")),
                name="hold_never_overcaptured",
            ),
            # Nothing is captured that was not reported.
            models.CheckConstraint(
                condition=Q(usage__gte=F("captured")), name="hold_capture_within_usage"
            ),
            models.CheckConstraint(
                condition=(
                    Q(state="active", refunded=0, settled_at__isnull=True)
                    | (
                        Q(state__in=["settled", "released", "expired"], settled_at__isnull=False)
                        & Q(amount=F("captured") + F("refunded"))
                    )
                ),
                name="hold_state_consistent",
            ),
            models.CheckConstraint(
                condition=~Q(state="released") | Q(captured=0),
                name="hold_released_captures_nothing",
            ),
        ]

    def __str__(self):
        return f"hold {self.id} {self.state} {self.captured}/{self.amount} µc"

    @property
    def is_active(self) -> bool:
        return self.state == HoldState.ACTIVE


class HoldAllocation(models.Model):
    """The part of a hold drawn from one bucket: where its refund goes back to."""

    # Indexed by the (hold, bucket) constraint; buckets are never deleted.
    hold = models.ForeignKey(
        Hold, on_delete=models.PROTECT, related_name="allocations", db_index=False
    )
    bucket = models.ForeignKey(
        Bucket, on_delete=models.PROTECT, related_name="allocations", db_index=False
    )
    amount = models.BigIntegerField()
    captured = models.BigIntegerField(default=0)
    refunded = models.BigIntegerField(default=0)

    class Meta:
        ordering = ("hold", "id")
        constraints = [
            models.UniqueConstraint(fields=["hold", "bucket"], name="allocation_once_per_bucket"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="allocation_amount_positive"),
            models.CheckConstraint(
                condition=Q(captured__gte=0, refunded__gte=0), name="allocation_parts_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(amount__gte=F("captured") + F("refunded")),
                name="allocation_never_overcaptured",
            ),
        ]

    def __str__(self):
        return f"{self.amount} µc of {self.bucket_id} for {self.hold_id}"


class UsageMark(models.Model):
    """The largest cumulative usage reported for one attempt of a hold's job."""

    hold = models.ForeignKey(
        Hold, on_delete=models.PROTECT, related_name="usage_marks", db_index=False
    )  # indexed by the (hold, attempt_key) constraint
    attempt_key = models.CharField(max_length=200, blank=True)
    cumulative = models.BigIntegerField()
    seq = models.BigIntegerField()
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("hold", "attempt_key")
        constraints = [
            models.UniqueConstraint(fields=["hold", "attempt_key"], name="usage_mark_per_attempt"),
            models.CheckConstraint(
                condition=Q(cumulative__gte=0, seq__gte=0), name="usage_mark_nonnegative"
            ),
        ]

    def __str__(self):
        return f"{self.hold_id}/{self.attempt_key or '-'}: {self.cumulative} µc (seq {self.seq})"


class Account(models.TextChoices):
    ISSUED = "issued", "Issued"
    AVAILABLE = "available", "Available"
    HELD = "held", "Held"
    CAPTURED = "captured", "Captured (unsettled)"
    CONSUMED = "consumed", "Consumed"
    EXPIRED = "expired", "Expired"


class EntryKind(models.TextChoices):
    ISSUE = "issue", "Issue"  # issued → available
    HOLD = "hold", "Hold"  # available → held (reserve, extend)
    CAPTURE = "capture", "Capture"  # held → captured (metered usage)
    SETTLE = "settle", "Settle"  # captured → consumed (the hold is closed)
    REFUND = "refund", "Refund"  # held → available (unused part of a settled hold)
    RELEASE = "release", "Release"  # held → available (a job that never ran)
    EXPIRE = "expire", "Expire"  # available → expired
    ADJUSTMENT = "adjustment", "Adjustment"  # issued ↔ available (operator correction)


class Entry(models.Model):
    """One leg of a double-entry ledger transaction. Never updated, never deleted.

    A PostgreSQL trigger refuses UPDATE, DELETE and TRUNCATE, and a statement trigger
    refuses any INSERT whose rows do not balance per transaction (`txn`): every ledger
    transaction is written by one INSERT and sums to zero.
    """

    id = models.BigAutoField(primary_key=True)
    # The hottest insert of all: indexes are (org, created_at, id) for the API, hold and
    # job for a job's story, and (created_at, id) of the positive legs for the audit
    # trail across all orgs; the reconciler reads everything in one pass anyway.
    txn = models.UUIDField(help_text="The ledger transaction this leg belongs to.")
    # The bucket's org, copied for scoping. No database FK: its check would share-lock
    # the org row from every concurrent ledger write; the reconciler checks it instead.
    org = models.ForeignKey(
        Org,
        on_delete=models.PROTECT,
        related_name="ledger_entries",
        db_index=False,
        db_constraint=False,
    )
    bucket = models.ForeignKey(
        Bucket, on_delete=models.PROTECT, related_name="entries", db_index=False
    )
    account = models.CharField(max_length=10, choices=Account.choices)
    counter_account = models.CharField(max_length=10, choices=Account.choices)
    amount = models.BigIntegerField(help_text="Signed micro-credits posted to `account`.")
    kind = models.CharField(max_length=10, choices=EntryKind.choices)
    hold = models.ForeignKey(
        Hold, null=True, blank=True, on_delete=models.PROTECT, related_name="entries"
    )
    job_id = models.UUIDField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, blank=True)
    usage_until = models.DateTimeField(
        null=True, blank=True, help_text="Captures: the usage they charge accrued before this."
    )
    memo = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("created_at", "id")
        verbose_name_plural = "entries"
        indexes = [
            models.Index(fields=["org", "created_at", "id"], name="entry_org_time"),
            # Partial: the audit trail lists only the positive leg of each movement, and
            # an org's listing (no amount filter) cannot pick it over entry_org_time.
            models.Index(fields=["created_at", "id"], name="entry_time", condition=Q(amount__gt=0)),
            models.Index(fields=["job_id"], name="entry_job", condition=Q(job_id__isnull=False)),
        ]
        constraints = [
            models.CheckConstraint(condition=~Q(amount=0), name="entry_amount_nonzero"),
            models.CheckConstraint(
                condition=~Q(account=F("counter_account")), name="entry_two_accounts"
            ),
            models.CheckConstraint(condition=Q(kind__in=EntryKind.values), name="entry_kind_valid"),
            models.CheckConstraint(
                condition=Q(account__in=Account.values, counter_account__in=Account.values),
                name="entry_accounts_valid",
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.amount:+} µc {self.account} ({self.bucket_id})"


class BudgetPeriod(models.TextChoices):
    MONTH = "month", "Calendar month (UTC)"
    TOTAL = "total", "Total"


class BudgetMode(models.TextChoices):
    HARD = "hard", "Hard (refuse)"
    SOFT = "soft", "Soft (alert)"


class Budget(models.Model):
    """A spending limit at one level: the org, a project, a user, or a user in a project.

    `held` caches the amounts of the active holds beneath it and `consumed` what settled
    holds beneath it captured in the current period (month budgets count a hold's
    capture in the month it settles). A hard budget keeps held + consumed <= limit.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # Indexed by the budget_per_scope constraint (org first); see Bucket.org.
    org = models.ForeignKey(Org, on_delete=models.PROTECT, related_name="budgets", db_index=False)
    project = models.ForeignKey(
        Project,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="budgets",
        db_index=False,
    )
    user = models.ForeignKey(
        User,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="budgets",
        db_index=False,
    )
    limit = models.BigIntegerField()
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    mode = models.CharField(max_length=8, choices=BudgetMode.choices)
    held = models.BigIntegerField(default=0)
    consumed = models.BigIntegerField(default=0)
    period_start = models.DateTimeField(
        null=True, blank=True, help_text="Start of the month being counted; empty for total."
    )
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # A budget with a large limit is kept in lanes, like a large grant (Bucket.lane_of):
    # rows of one scope that the holds of one busy org charge side by side. Each lane
    # carries `limit` (the budget's) and `share`, its part of a hard limit: a reservation
    # charges its own lane while that lane stays within its share and no lane is over its
    # share (`unbalanced`); otherwise it locks every lane of the budget and checks the
    # whole limit (services.budgets). A hold's lane is hold.lane % lanes, so its
    # settlement discharges the lane it charged. Held and consumed are the lane's own;
    # the budget's are the sums over its lanes (selectors.budget_totals).
    lane_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="other_lanes",
        db_index=False,
        help_text="The budget's first lane, for its other lanes; empty for the first.",
    )
    lane = models.SmallIntegerField(default=0, db_default=0)
    lanes = models.SmallIntegerField(default=1, db_default=1)
    share = models.BigIntegerField(help_text="This lane's part of a hard limit.")
    unbalanced = models.BooleanField(default=False, db_default=False)

    class Meta:
        ordering = ("org", "project", "user", "lane")
        constraints = [
            models.UniqueConstraint(
                fields=["org", "project", "user", "lane"],
                nulls_distinct=False,
                name="budget_lane_per_scope",
            ),
            models.CheckConstraint(
                condition=(Q(lane_of__isnull=True, lane=0) | Q(lane_of__isnull=False, lane__gt=0))
                & Q(lane__lt=F("lanes"), share__gte=0),
                name="budget_lane_valid",
            ),
            models.CheckConstraint(condition=Q(limit__gte=0), name="budget_limit_nonnegative"),
            models.CheckConstraint(
                condition=Q(held__gte=0, consumed__gte=0), name="budget_usage_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(period__in=BudgetPeriod.values, mode__in=BudgetMode.values),
                name="budget_choices_valid",
            ),
        ]

    def __str__(self):
        return f"{self.scope_label}: {self.mode} {self.limit} µc per {self.period}"

    def save(self, *args, **kwargs):
        if self.share is None:  # a budget made outside set_budget: one lane, all of it
            self.share = self.limit
        super().save(*args, **kwargs)

    @property
    def level(self) -> int:
        """0 org, 1 project, 2 user, 3 user within a project: the lock order."""
        return (1 if self.project_id else 0) + (2 if self.user_id else 0)

    @property
    def scope_label(self) -> str:
        parts = [f"org {self.org_id}"]
        if self.project_id:
            parts.append(f"project {self.project_id}")
        if self.user_id:
            parts.append(f"user {self.user_id}")
        return " / ".join(parts)


class BudgetAlert(models.Model):
    """A soft budget went over its limit: the reservation was allowed and this recorded."""

    budget = models.ForeignKey(Budget, on_delete=models.PROTECT, related_name="alerts")
    org = models.ForeignKey(Org, on_delete=models.PROTECT, related_name="+")
    hold = models.ForeignKey(
        Hold, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    amount = models.BigIntegerField(help_text="The reservation that went over.")
    limit = models.BigIntegerField()
    held = models.BigIntegerField()
    consumed = models.BigIntegerField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ("-created_at", "-id")

    def __str__(self):
        return f"budget {self.budget_id} over: {self.held + self.consumed}/{self.limit} µc"


class LedgerAuditEvent(models.Model):
    """A reconciler finding: an invariant violated (open until a later run no longer sees it)."""

    check_name = models.CharField(max_length=64)
    subject = models.CharField(max_length=200)
    detail = models.TextField()
    fingerprint = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now())
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at", "-id")
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"],
                condition=Q(resolved_at__isnull=True),
                name="audit_one_open_event_per_violation",
            )
        ]

    def __str__(self):
        return f"{self.check_name} {self.subject}"
