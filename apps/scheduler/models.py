"""The GPU fleet: GPU types with prices, nodes, and the GPUs on each node."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class GpuType(models.Model):
    name = models.CharField(max_length=32, primary_key=True)
    memory_gb = models.PositiveIntegerField()
    price_per_gpu_hour = models.BigIntegerField(help_text="Micro-credits per GPU-hour.")

    class Meta:
        ordering = ("-price_per_gpu_hour", "name")
        verbose_name = "GPU type"
        constraints = [
            models.CheckConstraint(
                condition=Q(price_per_gpu_hour__gte=0), name="gputype_price_nonneg"
            ),
            models.CheckConstraint(condition=Q(memory_gb__gt=0), name="gputype_memory_positive"),
        ]

    def __str__(self):
        return f"{self.name} ({self.memory_gb} GB)"


class NodeState(models.TextChoices):
    ACTIVE = "active", "Active"
    DRAINING = "draining", "Draining"  # runs what it has, gets nothing new
    DOWN = "down", "Down"


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(
                condition=Q(name__regex=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"),
                name="node_name_queue_safe",
            )
        ]

    def __str__(self):
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue this node's worker pool consumes."""
        return node_queue(self.name)


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="Position on the node (CUDA device index).")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="gpus")
    device_id = models.CharField(
        max_length=64, blank=True, help_text="What CUDA_VISIBLE_DEVICES gets (index if blank)."
    )

    class Meta:
        ordering = ("node__name", "index")
        verbose_name = "GPU"
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_index_per_node")]

    def __str__(self):
        return f"{self.node.name}:{self.index} ({self.gpu_type_id})"

    @property
    def visible_device(self) -> str:
        return self.device_id or str(self.index)


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
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
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
    UPSERT (services.usage.record_gpu_usage), once per finished attempt, so the hot path
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
