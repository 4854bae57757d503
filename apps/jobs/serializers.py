"""The job body of the public API (docs/api.md), and validation of submissions and list filters."""

from __future__ import annotations

from datetime import UTC

from rest_framework import serializers

from apps.jobs import queue_state, validation
from apps.jobs.models import DEFAULT_WEBHOOK_EVENTS, Job, JobEvent, JobStatus
from apps.jobs.services import results
from apps.jobs.services.lifecycle import tenant_reason


def iso(value) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def job_body(job: Job, *, queue_states: dict | None = None) -> dict:
    """The job as docs/api.md shows it (plus its spec). Builds a fresh signed result link.

    A queued job carries `queue` (its position, why it waits, its estimated start) from
    `queue_states` (job id -> QueueState, for a page of jobs) or read for it alone."""
    hold = job.hold if job.hold_id else None
    result = None
    if job.result_path:
        link = results.signed_result_link(job)
        result = {"url": link.url, "expires_at": iso(link.expires_at)}
    return {
        "id": str(job.id),
        "status": job.status,
        "tier": job.tier,
        "project": str(job.project_id),
        "user": str(job.user_id) if job.user_id else None,
        "progress": job.progress,
        "params": job.params,
        "resources": {
            "gpu_count": job.gpu_count,
            "gpu_types": list(job.gpu_types),
            "min_gpu_memory_gb": job.min_gpu_memory_gb,
        },
        "max_runtime_s": job.max_runtime_s,
        "preemptible": job.preemptible,
        "webhook_url": job.webhook_url or None,
        "webhook_events": list(job.webhook_events),
        "gpu_type": job.gpu_type or None,
        "attempts": job.attempt_count,
        "preemptions": job.preemption_count,
        "cancel_requested": job.cancel_requested,
        "reused_from": str(job.reused_from_id) if job.reused_from_id else None,
        "hold": None
        if hold is None
        else {
            "id": str(hold.id),
            "amount": hold.amount,
            "charged": hold.captured,
            "refunded": hold.refunded,
            "state": hold.state,
        },
        "error": {"code": job.error_code, "message": job.error_message} if job.error_code else None,
        "result": result,
        "created_at": iso(job.created_at),
        "start_deadline_at": iso(job.start_deadline_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "queue": _queue_of(job, queue_states),
    }


def _queue_of(job: Job, queue_states: dict | None) -> dict | None:
    if job.status != JobStatus.QUEUED:
        return None
    if queue_states is None:
        queue_states = queue_state.read([job.id])
    return queue_states.get(str(job.id), queue_state.UNKNOWN).body()


class HoldSerializer(serializers.Serializer):
    id = serializers.CharField()
    amount = serializers.IntegerField(help_text="Micro-credits held.")
    charged = serializers.IntegerField()
    refunded = serializers.IntegerField()
    state = serializers.ChoiceField(choices=["active", "settled", "released", "expired"])


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class ResultLinkSerializer(serializers.Serializer):
    url = serializers.URLField()
    expires_at = serializers.DateTimeField()


class QueueSerializer(serializers.Serializer):
    position = serializers.IntegerField(
        allow_null=True,
        help_text="1 = next to start among the jobs that compete for the same GPUs.",
    )
    reason = serializers.CharField(help_text="Why it waits, e.g. waiting for an H100: 1 of 1 busy.")
    estimated_start_at = serializers.DateTimeField(allow_null=True)


class ResourcesSerializer(serializers.Serializer):
    gpu_count = serializers.IntegerField(min_value=1, max_value=validation.MAX_GPU_COUNT, default=1)
    gpu_types = serializers.ListField(
        child=serializers.CharField(max_length=validation.MAX_GPU_TYPE_LENGTH),
        required=False,
        max_length=validation.MAX_GPU_TYPES,
        help_text="Allowed GPU types, most preferred first; empty or absent: any.",
    )
    min_gpu_memory_gb = serializers.IntegerField(
        min_value=0, max_value=validation.MAX_GPU_MEMORY_GB, default=0
    )

    def to_internal_value(self, data):
        _refuse_unknown_fields(self, data)
        return super().to_internal_value(data)


class JobSerializer(serializers.Serializer):
    """Read-only: the job body (docs/api.md)."""

    id = serializers.CharField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    tier = serializers.CharField()
    project = serializers.CharField()
    user = serializers.CharField(allow_null=True)
    progress = serializers.FloatField()
    params = serializers.DictField()
    resources = ResourcesSerializer()
    max_runtime_s = serializers.IntegerField()
    preemptible = serializers.BooleanField()
    webhook_url = serializers.CharField(allow_null=True)
    webhook_events = serializers.ListField(
        child=serializers.ChoiceField(choices=validation.WEBHOOK_EVENTS),
        help_text="What the webhook is sent for.",
    )
    gpu_type = serializers.CharField(allow_null=True)
    attempts = serializers.IntegerField()
    preemptions = serializers.IntegerField()
    cancel_requested = serializers.BooleanField()
    reused_from = serializers.CharField(allow_null=True)
    hold = HoldSerializer(allow_null=True)
    error = ErrorSerializer(allow_null=True)
    result = ResultLinkSerializer(allow_null=True)
    created_at = serializers.DateTimeField()
    start_deadline_at = serializers.DateTimeField(
        allow_null=True, help_text="Not started by then: cancelled (deadline_exceeded)."
    )
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    queue = QueueSerializer(allow_null=True, help_text="Where a queued job stands; else null.")

    def to_representation(self, instance):
        return job_body(instance)


def _refuse_unknown_fields(serializer: serializers.Serializer, data) -> None:
    if isinstance(data, dict):
        unknown = sorted(set(data) - set(serializer.fields))
        if unknown:
            raise serializers.ValidationError({unknown[0]: ["Unknown field."]})


class WebhookEventsField(serializers.ListField):
    """A list of distinct event names, put in the order a job lives them. Every refusal
    names the list itself (`webhook_events`), not the offending item."""

    child = serializers.ChoiceField(choices=validation.WEBHOOK_EVENTS)
    default_error_messages = {"duplicate": validation.DUPLICATE_EVENT}

    def to_internal_value(self, data):
        try:
            events = super().to_internal_value(data)
        except serializers.ValidationError as error:
            if isinstance(error.detail, dict):  # {index: [message]} of the first bad items
                raise serializers.ValidationError(next(iter(error.detail.values()))) from None
            raise
        for index, event in enumerate(events):
            if event in events[:index]:
                self.fail("duplicate", value=event)
        return [event for event in validation.WEBHOOK_EVENTS if event in events]


# The schema of the submission body and the reference of its validation: the view
# validates with apps.jobs.validation.validate_submit_body, which agrees with this
# serializer (tests/jobs/test_submit_validation.py) at a fraction of its cost. (Not in the
# docstring: that becomes the schema's public description.)
class JobSubmitSerializer(serializers.Serializer):
    """The body of POST /v1/jobs (the Idempotency-Key header is required)."""

    project = serializers.CharField(
        required=False,
        max_length=validation.MAX_PROJECT_LENGTH,
        help_text="Project id or name (default: the key's).",
    )
    params = serializers.DictField(help_text="Passed to the generator as JSON.")
    resources = ResourcesSerializer(required=False)
    max_runtime_s = serializers.IntegerField(
        min_value=1, help_text="Seconds; the credit hold covers this on the priciest type."
    )
    preemptible = serializers.BooleanField(default=True)
    webhook_url = serializers.CharField(
        required=False, allow_blank=True, max_length=validation.MAX_WEBHOOK_URL_LENGTH
    )
    webhook_events = WebhookEventsField(
        required=False,
        allow_empty=False,
        help_text="What the webhook is sent for, of start (each attempt that starts "
        "running), progress (at most one a second) and completed (a terminal status); "
        'each at most once. Default ["completed"]; anything else needs a webhook_url.',
    )
    start_deadline_s = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=validation.MAX_START_DEADLINE_S,
        help_text="Seconds from submission: a job not started by then ends cancelled "
        "(error code deadline_exceeded), its hold released in full. Null or absent: none.",
    )

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        _refuse_unknown_fields(self, data)
        return super().to_internal_value(data)

    def validate(self, attrs):
        events = attrs.get("webhook_events")
        if (
            events is not None
            and tuple(events) != DEFAULT_WEBHOOK_EVENTS
            and not attrs.get("webhook_url")
        ):
            raise serializers.ValidationError({"webhook_events": [validation.EVENTS_WITHOUT_URL]})
        return attrs


class JobListFilterSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=JobStatus.values, required=False)
    project = serializers.CharField(required=False, max_length=200)
    cursor = serializers.CharField(required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=500)


class JobEventSerializer(serializers.Serializer):
    """One event: {"at", "from", "to", "reason", "actor"}; `from` is null for creation."""

    at = serializers.DateTimeField()
    reason = serializers.CharField()
    actor = serializers.CharField()

    def to_representation(self, event: JobEvent) -> dict:
        operator = self.context.get("operator", False)
        return {
            "at": iso(event.at),
            "from": event.from_status or None,
            "to": event.to_status,
            "reason": event.reason if operator else tenant_reason(event),
            "actor": event.actor,
        }


# `from` is a Python keyword: declared for the schema after the class body.
JobEventSerializer._declared_fields["from"] = serializers.CharField(allow_null=True)
JobEventSerializer._declared_fields["to"] = serializers.CharField()


class WebhookSecretSerializer(serializers.Serializer):
    secret = serializers.CharField()
    signature_header = serializers.CharField()
    scheme = serializers.CharField()
