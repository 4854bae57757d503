"""Jobs: the job spec and state, each attempt to run it, and the append-only event log."""

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from apps.accounts.models import Tier
from apps.core.ids import new_id


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    PREEMPTING = "preempting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.CANCELLED}
)
ACTIVE_STATUSES = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.PREEMPTING})


class WebhookEvent(models.TextChoices):
    """What a job's webhook is POSTed for (the submission's `webhook_events`)."""

    START = "start"  # an attempt started running (scheduled → running), each attempt
    PROGRESS = "progress"  # the job's progress rose (at most one a second)
    COMPLETED = "completed"  # a terminal status


DEFAULT_WEBHOOK_EVENTS = (WebhookEvent.COMPLETED.value,)


def default_webhook_events() -> list[str]:
    return list(DEFAULT_WEBHOOK_EVENTS)


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    # No index of its own: job_org_recent and job_org_status lead with org (every
    # submission inserts into each index of this table).
    org = models.ForeignKey(
        "accounts.Org", on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    project = models.ForeignKey("accounts.Project", on_delete=models.PROTECT, related_name="jobs")
    user = models.ForeignKey(
        "accounts.User", null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    tier = models.CharField(max_length=16, choices=Tier.choices)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)

    # The spec, as submitted.
    params = models.JSONField()
    gpu_count = models.PositiveSmallIntegerField()
    gpu_types = ArrayField(
        models.CharField(max_length=32),
        default=list,
        blank=True,
        help_text="Allowed GPU types, most preferred first; empty: any.",
    )
    min_gpu_memory_gb = models.PositiveIntegerField(default=0)
    max_runtime_s = models.PositiveIntegerField()
    preemptible = models.BooleanField(default=True)
    webhook_url = models.URLField(max_length=2000, blank=True)
    # The database default too: rows inserted by code that predates the column (a rolling
    # deploy) get what such a job always got, the terminal webhook only.
    webhook_events = ArrayField(
        models.CharField(max_length=16, choices=WebhookEvent.choices),
        default=default_webhook_events,
        db_default=list(DEFAULT_WEBHOOK_EVENTS),
        blank=True,
        help_text="What the webhook is sent for: start, progress, completed.",
    )
    # sha256 of canonical params + resources: dedup and poison containment. Looked up by
    # equality only: a plain index (job_fingerprint), not db_index's extra LIKE index.
    fingerprint = models.CharField(max_length=64)

    # Admission.
    # The client's Idempotency-Key (at most 255 characters), prefixed with its project
    # for a project-bound API key (scoped_idempotency_key).
    idempotency_key = models.CharField(max_length=320, null=True, blank=True)
    request_digest = models.CharField(max_length=64, blank=True)
    hold = models.OneToOneField(
        "ledger.Hold", null=True, blank=True, on_delete=models.PROTECT, related_name="job"
    )
    # Indexed by job_reused_from, partial: almost every job has none.
    reused_from = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        help_text="Deduplicated: the earlier successful job whose result this one returns.",
    )

    # Progress of the run.
    progress = models.FloatField(default=0.0)
    attempt_count = models.PositiveSmallIntegerField(default=0)
    preemption_count = models.PositiveSmallIntegerField(default=0)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    not_before = models.DateTimeField(
        null=True, blank=True, help_text="Retry backoff: not scheduled before this instant."
    )
    queued_at = models.DateTimeField(help_text="When the job last entered the queue (aging).")
    # Written by the database clock at the insert (submission + start_deadline_s): a job
    # that never started by then is cancelled (deadline_exceeded) and never placed.
    start_deadline_at = models.DateTimeField(
        null=True, blank=True, help_text="Not started by then: cancelled, nothing charged."
    )
    checkpoint_ref = models.CharField(max_length=500, blank=True)
    gpu_type = models.CharField(max_length=32, blank=True, help_text="Of the latest placement.")
    cancel_requested = models.BooleanField(default=False)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    result_path = models.CharField(max_length=500, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        indexes = [
            models.Index(fields=["org", "-created_at"], name="job_org_recent"),
            # The operators' list of every org's jobs, newest first (the admin).
            models.Index(fields=["created_at", "id"], name="job_recent"),
            models.Index(fields=["status", "queued_at"], name="job_status_queue"),
            models.Index(fields=["org", "status"], name="job_org_status"),
            models.Index(fields=["fingerprint"], name="job_fingerprint"),
            # Partial: only deduplicated jobs have one (no index entry to write per job).
            models.Index(
                fields=["reused_from"],
                condition=Q(reused_from__isnull=False),
                name="job_reused_from",
            ),
            # The start-deadline sweep: queued jobs with a deadline, soonest first. Partial,
            # so a submission without a deadline writes no entry, and small (queued only).
            models.Index(
                fields=["start_deadline_at"],
                condition=Q(status="queued", start_deadline_at__isnull=False),
                name="job_start_deadline",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["org", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_key_per_org",
            ),
            models.CheckConstraint(
                condition=Q(gpu_count__gte=1, gpu_count__lte=8), name="job_gpu_count_1_to_8"
            ),
            models.CheckConstraint(condition=Q(max_runtime_s__gt=0), name="job_runtime_positive"),
            models.CheckConstraint(
                condition=Q(progress__gte=0, progress__lte=1), name="job_progress_fraction"
            ),
            models.CheckConstraint(
                condition=Q(webhook_events__contained_by=[e.value for e in WebhookEvent]),
                name="job_webhook_events_known",
            ),
            models.CheckConstraint(
                condition=Q(finished_at__isnull=True) | Q(status__in=sorted(TERMINAL_STATUSES)),
                name="job_finished_only_when_terminal",
            ),
        ]

    def __str__(self):
        return f"job {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class AttemptState(models.TextChoices):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    STOPPING = "stopping"  # asked to stop (preempted or cancelled); GPUs still held
    FINISHED = "finished"


# A worker holds the attempt (it was claimed and has not finished): leases apply.
CLAIMED_ATTEMPT_STATES = (AttemptState.RUNNING, AttemptState.STOPPING)
# Not finished: placed and perhaps not yet claimed, or claimed. Its GPUs are held.
UNFINISHED_ATTEMPT_STATES = (AttemptState.SCHEDULED, *CLAIMED_ATTEMPT_STATES)


class ExitClass(models.TextChoices):
    SUCCEEDED = "succeeded"
    CRASHED = "crashed"
    OOM = "oom"
    HUNG = "hung"
    TIMED_OUT = "timed_out"
    KILLED = "killed"  # stopped on request: cancel
    PREEMPTED = "preempted"
    LOST = "lost"  # lease expired: the worker vanished
    BAD_INPUT = "bad_input"
    NODE_FAULT = "node_fault"


class Attempt(models.Model):
    """One placement of a job on GPUs of one node; priced at placement."""

    id = models.UUIDField(primary_key=True, default=new_id, editable=False)
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="attempts")
    # The job's org, copied at placement: an org's spend over a window is read through
    # attempt_org_ended (its attempts by end), not through every job it ever ran.
    org = models.ForeignKey(
        "accounts.Org", on_delete=models.PROTECT, related_name="attempts", db_index=False
    )
    number = models.PositiveSmallIntegerField()
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT, related_name="attempts")
    gpu_type = models.CharField(max_length=32)
    price_per_gpu_hour = models.BigIntegerField()
    gpu_indices = ArrayField(models.PositiveSmallIntegerField())
    devices = models.CharField(max_length=200, help_text="CUDA_VISIBLE_DEVICES for the run.")
    # A claim must present this token; a duplicate or late message carries a stale one.
    fencing_token = models.BigIntegerField()
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.SCHEDULED
    )
    lease_expires_at = models.DateTimeField()
    worker = models.CharField(max_length=200, blank=True)
    exit_class = models.CharField(max_length=16, choices=ExitClass.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error_message = models.TextField(blank=True)
    checkpoint_ref = models.CharField(max_length=500, blank=True)
    checkpointed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its worker last reported a checkpoint (database clock): a "
        "preemption loses the work since then.",
    )
    gpu_ms = models.BigIntegerField(default=0, help_text="GPU-milliseconds used (all its GPUs).")
    charged = models.BigIntegerField(default=0, help_text="Micro-credits captured for it.")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("job", "number")
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_number_per_job"),
            models.UniqueConstraint(fields=["fencing_token"], name="attempt_fencing_token_unique"),
            # At most one live attempt per job: a job never runs on two nodes at once.
            models.UniqueConstraint(
                fields=["job"],
                condition=~Q(state="finished"),
                name="attempt_one_live_per_job",
            ),
            models.CheckConstraint(
                condition=Q(gpu_ms__gte=0, charged__gte=0), name="attempt_usage_nonneg"
            ),
        ]
        indexes = [
            # The scheduler folds recently ended attempts into fair share every tick.
            models.Index(
                fields=["finished_at"],
                condition=Q(started_at__isnull=False),
                name="attempt_ended",
            ),
            # An org's attempts still running (NULL) or ended since a time: the admin's
            # org list (spend over 24 hours and 30 days, GPU-hours).
            models.Index(fields=["org", "finished_at"], name="attempt_org_ended"),
        ]

    def __str__(self):
        return f"attempt {self.number} of job {self.job_id} on {self.node_id} ({self.state})"


class GpuAssignment(models.Model):
    """A GPU given to an attempt; released when the attempt has left it."""

    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="assignments")
    gpu = models.ForeignKey("fleet.Gpu", on_delete=models.PROTECT, related_name="assignments")
    assigned_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The database refuses to give one GPU to two live attempts.
            models.UniqueConstraint(
                fields=["gpu"],
                condition=Q(released_at__isnull=True),
                name="gpu_one_live_assignment",
            )
        ]

    def __str__(self):
        return f"{self.gpu} → {self.attempt_id}"


class JobEvent(models.Model):
    """One transition of a job; append-only (a trigger refuses UPDATE and DELETE)."""

    # Indexed by jobevent_job_at, which leads with job.
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="events", db_index=False)
    # Indexed by jobevent_attempt, partial: a submission's event has none.
    attempt = models.ForeignKey(
        Attempt, null=True, blank=True, on_delete=models.PROTECT, db_index=False
    )
    at = models.DateTimeField(db_default=models.functions.Now())
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    reason = models.TextField()
    actor = models.CharField(max_length=100, help_text="api, scheduler, worker:<name>, operator…")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ("at", "id")
        indexes = [
            models.Index(fields=["job", "at"], name="jobevent_job_at"),
            # The audit trail reads every job's events newest first.
            models.Index(fields=["at", "id"], name="jobevent_at"),
            models.Index(
                fields=["attempt"], condition=Q(attempt__isnull=False), name="jobevent_attempt"
            ),
        ]

    def __str__(self):
        return f"{self.job_id}: {self.from_status or '∅'} → {self.to_status}"


class QuarantinedFingerprint(models.Model):
    """A params fingerprint that hung or crashed on several nodes: refused at submission."""

    fingerprint = models.CharField(max_length=64, primary_key=True)
    reason = models.TextField()
    node_count = models.PositiveSmallIntegerField()
    sample_job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "quarantined fingerprint"

    def __str__(self):
        return self.fingerprint[:12]
