"""The scheduler's records: dispatch decisions, node claims and fair-share usage."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class DecisionKind(models.TextChoices):
    PLACE = "place", "Placement"
    PREEMPT = "preempt", "Preemption"
    RESERVE = "reserve", "Reservation"  # a node drained for a blocked multi-GPU job


class DecisionOutcome(models.TextChoices):
    APPLIED = "applied", "Applied"
    SKIPPED = "skipped", "Skipped"  # its guard failed: the world changed since the snapshot


class DispatchDecision(models.Model):
    """One decision of the policy and what became of it: the operators' audit trail.

    A placement names the job, node, GPUs and the attempt it created; a preemption names
    the job it makes room for (`job`) and the victims it asked to stop. `reason` is the
    policy's own explanation; `skip_reason` says which guard refused a skipped decision.
    """

    at = models.DateTimeField(db_default=Now(), db_index=True)
    tick = models.UUIDField(help_text="The dispatch tick that made the decision.")
    kind = models.CharField(max_length=16, choices=DecisionKind.choices)
    outcome = models.CharField(max_length=16, choices=DecisionOutcome.choices)
    job = models.ForeignKey(
        "jobs.Job",
        on_delete=models.PROTECT,
        related_name="dispatch_decisions",
        help_text="Placed job, or the job a preemption makes room for.",
    )
    node_name = models.CharField(max_length=100)
    gpu_type = models.CharField(max_length=32, blank=True)
    gpu_indices = ArrayField(models.PositiveSmallIntegerField(), default=list, blank=True)
    attempt = models.ForeignKey(
        "jobs.Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    victims = ArrayField(
        models.UUIDField(), default=list, blank=True, help_text="Jobs asked to stop."
    )
    reason = models.TextField()
    skip_reason = models.TextField(blank=True)

    class Meta:
        ordering = ("-at", "-id")
        indexes = [models.Index(fields=["job", "at"], name="dispatchdecision_job_at")]

    def __str__(self):
        return f"{self.kind} {self.job_id} on {self.node_name} ({self.outcome})"


class NodeClaim(models.Model):
    """The node whose GPUs are being freed for `job` (the policy's `claimed_node`).

    Made by a preemption (victims stopping) or a reservation (the node drained for a
    multi-GPU job, others only backfill). Kept until the job is placed (deleted in the
    placement's transaction), leaves the queue, or outlives GANTRY_NODE_CLAIM_TTL_S.
    """

    job = models.OneToOneField(
        "jobs.Job", primary_key=True, on_delete=models.CASCADE, related_name="+"
    )
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=DecisionKind.choices)
    decision = models.ForeignKey(
        DispatchDecision, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(db_default=Now())

    def __str__(self):
        return f"{self.job_id} claims {self.node_id} ({self.kind})"


class UsageScope(models.TextChoices):
    TIER = "tier"
    ORG = "org"
    USER = "user"


class UsageAccount(models.Model):
    """Decayed GPU-seconds of one tier, org or user, as of `as_of` (fair share's memory).

    `value` halves every usage half-life; it is brought forward and added to in one
    UPSERT (services.usage.add_gpu_usage), once per finished attempt, so the hot path
    (heartbeats) never touches these rows. Key: tier name, org id, or "org id/user id".
    """

    scope = models.CharField(max_length=8, choices=UsageScope.choices)
    key = models.CharField(max_length=100)
    value = models.FloatField(default=0.0)
    as_of = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="usage_account_per_key"),
            models.CheckConstraint(condition=Q(value__gte=0), name="usage_account_nonneg"),
        ]

    def __str__(self):
        return f"{self.scope} {self.key}: {self.value:.0f} GPU-s"


class RecordedAttemptUsage(models.Model):
    """Marks an attempt whose GPU time is folded into UsageAccount (exactly once)."""

    attempt = models.OneToOneField(
        "jobs.Attempt", primary_key=True, on_delete=models.CASCADE, related_name="+"
    )
    gpu_seconds = models.FloatField()
    recorded_at = models.DateTimeField(db_default=Now())

    def __str__(self):
        return f"{self.attempt_id}: {self.gpu_seconds:.0f} GPU-s"
