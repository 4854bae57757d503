"""Tenancy: orgs (with tier and fair-share weight), projects, users and API keys."""

from django.db import models
from django.db.models import Q

from apps.core.ids import new_id


class Tier(models.TextChoices):
    FREE = "free", "Free"
    PAID = "paid", "Paid"
    ENTERPRISE = "enterprise", "Enterprise"


class Org(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    name = models.CharField(max_length=200, unique=True)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.FREE, db_index=True)
    weight = models.FloatField(default=1.0, help_text="Fair-share weight within its tier.")
    # Per-org overrides of the tier defaults in settings.GANTRY_TIER_DEFAULTS (null: default).
    max_queued_jobs = models.PositiveIntegerField(null=True, blank=True)
    max_running_jobs = models.PositiveIntegerField(null=True, blank=True)
    rate_per_s = models.FloatField(null=True, blank=True, help_text="Submissions per second.")
    rate_burst = models.PositiveIntegerField(null=True, blank=True)
    dedup_enabled = models.BooleanField(
        default=False, help_text="Identical submissions may reuse an earlier successful result."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(condition=Q(weight__gt=0), name="org_weight_positive"),
            models.CheckConstraint(
                condition=Q(rate_per_s__isnull=True) | Q(rate_per_s__gt=0), name="org_rate_positive"
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.tier})"


class Project(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    org = models.ForeignKey(Org, on_delete=models.PROTECT, related_name="projects")
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("org__name", "name")
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="project_name_per_org")]

    def __str__(self):
        return f"{self.org.name}/{self.name}"


class User(models.Model):
    """A tenant's member: who submits jobs. Not a Django login (operators use auth.User)."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    org = models.ForeignKey(Org, on_delete=models.PROTECT, related_name="users")
    name = models.CharField(max_length=200)
    weight = models.FloatField(default=1.0, help_text="Fair-share weight within its org.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("org__name", "name")
        verbose_name = "tenant user"
        constraints = [
            models.UniqueConstraint(fields=["org", "name"], name="user_name_per_org"),
            models.CheckConstraint(condition=Q(weight__gt=0), name="user_weight_positive"),
        ]

    def __str__(self):
        return f"{self.org.name}/{self.name}"


# An operator key is tied to nothing; any other key to exactly one org.
OPERATOR_KEY_SCOPE = Q(is_operator=True, org__isnull=True, project__isnull=True, user__isnull=True)


class APIKey(models.Model):
    """An API key, stored as a SHA-256 digest; only a short prefix is kept in clear.

    Keys are 256-bit random secrets, so a fast digest is enough (no password stretching).
    An operator key belongs to no org; every other key belongs to exactly one org and
    optionally narrows to one project and/or one user.
    """

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    name = models.CharField(max_length=200, blank=True)
    prefix = models.CharField(max_length=16, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    is_operator = models.BooleanField(default=False)
    org = models.ForeignKey(
        Org, null=True, blank=True, on_delete=models.PROTECT, related_name="api_keys"
    )
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.PROTECT)
    user = models.ForeignKey(User, null=True, blank=True, on_delete=models.PROTECT)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        verbose_name = "API key"
        constraints = [
            models.CheckConstraint(
                condition=OPERATOR_KEY_SCOPE | Q(is_operator=False, org__isnull=False),
                name="apikey_operator_xor_org",
            ),
        ]

    def __str__(self):
        return f"{self.prefix}… ({'operator' if self.is_operator else self.org_id})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class OperatorAction(models.Model):
    """One thing an operator did (drain a node, cancel a job, grant credit, change an org…).

    Append-only (a trigger refuses UPDATE and DELETE): part of the audit trail beside
    ledger entries, job events and dispatch decisions. `before`/`after` hold what the
    target looked like around the action; `outcome` says whether it was done or refused.
    `job_id` is a plain id (the jobs app depends on accounts, not the reverse).
    """

    class Outcome(models.TextChoices):
        DONE = "done", "Done"
        REFUSED = "refused", "Refused"

    at = models.DateTimeField(db_default=models.functions.Now())
    actor = models.CharField(max_length=200, help_text="Who: e.g. admin:<username>.")
    action = models.CharField(max_length=64, help_text="What: e.g. node.drain, job.cancel.")
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=200)
    org = models.ForeignKey(
        Org, null=True, blank=True, on_delete=models.PROTECT, related_name="operator_actions"
    )
    job_id = models.UUIDField(null=True, blank=True)
    outcome = models.CharField(max_length=8, choices=Outcome.choices, default=Outcome.DONE)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    note = models.TextField(blank=True)
    # The same operator request recorded twice (a double submit) is one row.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)

    class Meta:
        ordering = ("-at", "-id")
        indexes = [
            models.Index(fields=["at", "id"], name="operatoraction_time"),
            models.Index(fields=["org", "at"], name="operatoraction_org_time"),
            models.Index(
                fields=["job_id", "at"],
                name="operatoraction_job_time",
                condition=Q(job_id__isnull=False),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="operatoraction_idempotency_key",
            )
        ]

    def __str__(self):
        return f"{self.actor} {self.action} {self.target_type} {self.target_id}"
