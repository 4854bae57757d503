"""The job body of the public API (docs/api.md), validation of submissions and list
filters, and the operators' quarantined fingerprints."""

from __future__ import annotations

from datetime import UTC

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from apps.core.errors import GantryError
from apps.core.schema import example, python_pattern_as_ecma
from apps.jobs import queue_state, validation
from apps.jobs.models import DEFAULT_WEBHOOK_EVENTS, Job, JobEvent, JobStatus
from apps.jobs.services import results
from apps.jobs.services.lifecycle import tenant_reason
from apps.jobs.services.params_schema import generator_params_schema
from apps.ledger.models import HoldState


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
            # Live while the job runs (usage is captured into the ledger once a minute).
            "charged": hold.captured
            if hold.state != HoldState.ACTIVE
            else max(hold.captured, min(hold.usage, hold.amount)),
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


# The examples of the schema (docs/api.md).
SUBMIT_EXAMPLE = {
    "project": "render",
    "params": {"prompt": "a red fox in snow", "seed": 7, "steps": 20, "step_seconds": 0.5},
    "resources": {"gpu_count": 1, "gpu_types": ["H100", "A100"], "min_gpu_memory_gb": 40},
    "max_runtime_s": 600,
    "preemptible": True,
    "webhook_url": "https://client.example/hook",
    "webhook_events": ["start", "completed"],
    "start_deadline_s": 300,
}
JOB_EXAMPLE = {
    "id": "4e8b2c6d-0a1f-4d3e-8b7c-9a5f1e2d6c87",
    "status": "queued",
    "tier": "paid",
    "project": "5c9a2f44-1b7e-4c1f-8d7b-2e6f0a9c4d21",
    "user": None,
    "progress": 0.0,
    "params": SUBMIT_EXAMPLE["params"],
    "resources": SUBMIT_EXAMPLE["resources"],
    "max_runtime_s": 600,
    "preemptible": True,
    "webhook_url": "https://client.example/hook",
    "webhook_events": ["start", "completed"],
    "gpu_type": None,
    "attempts": 0,
    "preemptions": 0,
    "cancel_requested": False,
    "reused_from": None,
    "hold": {
        "id": "9f1c4e7a-2d6b-4a8e-b3f0-5c9d2e1a7b76",
        "amount": 666667,
        "charged": 0,
        "refunded": 0,
        "state": "active",
    },
    "error": None,
    "result": None,
    "created_at": "2026-01-15T09:30:00Z",
    "start_deadline_at": "2026-01-15T09:35:00Z",
    "started_at": None,
    "finished_at": None,
    "queue": {
        "position": 3,
        "reason": "waiting for an H100: 1 of 1 busy",
        "estimated_start_at": "2026-01-15T09:41:00Z",
    },
}


def _queue_of(job: Job, queue_states: dict | None) -> dict | None:
    if job.status != JobStatus.QUEUED:
        return None
    if queue_states is None:
        queue_states = queue_state.read_for([job])
    return queue_states.get(str(job.id), queue_state.UNKNOWN).body()


class HoldSerializer(serializers.Serializer):
    id = serializers.CharField()
    amount = serializers.IntegerField(help_text="Micro-credits held.")
    charged = serializers.IntegerField()
    refunded = serializers.IntegerField()
    state = serializers.ChoiceField(choices=["active", "settled", "released", "expired"])


@extend_schema_serializer(component_name="JobError")
class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class ResultLinkSerializer(serializers.Serializer):
    url = serializers.URLField()
    expires_at = serializers.DateTimeField()


class QueueSerializer(serializers.Serializer):
    position = serializers.IntegerField(
        allow_null=True,
        help_text="1 = next to start among the jobs that compete for the same GPUs; null "
        "when not known yet, or when no active node could hold the job.",
    )
    reason = serializers.CharField(help_text="Why it waits, e.g. waiting for an H100: 1 of 1 busy.")
    estimated_start_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When it is expected to start; null when not known, or when no active node "
        "could hold the job.",
    )


class ResourcesSerializer(serializers.Serializer):
    refuses_unknown_fields = True  # _refuse_unknown_fields

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


@extend_schema_serializer(
    examples=[example("A queued job", JOB_EXAMPLE, response=True, status_codes=[200, 201, 202])]
)
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


@extend_schema_field(
    {
        "type": "array",
        "items": {"type": "string", "enum": list(validation.WEBHOOK_EVENTS)},
        "minItems": 1,
        "uniqueItems": True,
    }
)
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


class GeneratorParamsField(serializers.DictField):
    """A job's `params`: a JSON object, checked against the generator's JSON Schema at
    submission (the schema documents that schema in its place)."""


class GeneratorParamsFieldSchema(OpenApiSerializerFieldExtension):
    """`params` in the OpenAPI schema: the generator's own JSON Schema, as it is when the
    schema is generated (GET /v1/generator/schema serves the same)."""

    target_class = GeneratorParamsField

    def map_serializer_field(self, auto_schema, direction):
        try:
            published = generator_params_schema()
        except (GantryError, OSError, ValueError):  # none published, or unreadable
            published = None
        if published is None or _has_references(published):
            # A `$ref` points into the generator's document, not this one: not inlined.
            schema = {"type": "object", "additionalProperties": True}
        else:
            schema = as_openapi_30(published)
        return {
            **schema,
            "description": "Passed to the generator as JSON; it must satisfy the generator's "
            "JSON Schema (GET /v1/generator/schema), else a 400 naming the path "
            "(`params.steps`). " + schema.get("description", ""),
        }


def _has_references(schema) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_has_references(value) for value in schema.values())
    if isinstance(schema, list):
        return any(_has_references(item) for item in schema)
    return False


def as_openapi_30(schema):
    """A JSON Schema (draft 2020-12) as an OpenAPI 3.0 schema object: without `$schema`,
    `$id` and `$comment`, `examples` as `example`, `const` as a one-value `enum`, a `type`
    list as `anyOf` the types (with "null" as `nullable`), and patterns as Python's `re`
    reads them (apps.jobs.services.params_schema checks with the jsonschema package)."""
    if isinstance(schema, list):
        return [as_openapi_30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {}
    for key, value in schema.items():
        if key in ("$schema", "$id", "$comment"):
            continue
        if key == "examples" and isinstance(value, list):
            if value:
                converted["example"] = value[0]
        elif key == "pattern" and isinstance(value, str):
            converted[key] = python_pattern_as_ecma(value)  # the server's jsonschema uses re
        elif key == "const":
            converted["enum"] = [value]
        elif key == "type" and isinstance(value, list):
            types = [kind for kind in value if kind != "null"]
            if len(types) == 1:
                converted["type"] = types[0]
            elif types and "anyOf" not in schema:
                converted["anyOf"] = [{"type": kind} for kind in types]
            if "null" in value:
                converted["nullable"] = True
        elif key in ("properties", "patternProperties", "$defs", "definitions"):
            converted[key] = {name: as_openapi_30(sub) for name, sub in value.items()}
        elif isinstance(value, dict | list) and key not in ("enum", "default", "required"):
            converted[key] = as_openapi_30(value)
        else:
            converted[key] = value
    return converted


class RuntimeField(serializers.IntegerField):
    """max_runtime_s: the serializer takes 1 and up; the tier's limits apply after."""


class RuntimeFieldSchema(OpenApiSerializerFieldExtension):
    """max_runtime_s in the schema: within the widest tier's limits (GANTRY_TIER_RUNTIME_LIMITS;
    each tier allows a part of it)."""

    target_class = RuntimeField

    def map_serializer_field(self, auto_schema, direction):
        limits = settings.GANTRY_TIER_RUNTIME_LIMITS
        tiers = "; ".join(
            f"{tier} {limit['min_runtime_s']} to {limit['max_runtime_s']}"
            for tier, limit in limits.items()
        )
        return {
            "type": "integer",
            "minimum": min(limit["min_runtime_s"] for limit in limits.values()),
            "maximum": max(limit["max_runtime_s"] for limit in limits.values()),
            "description": "Seconds; the credit hold covers this on the priciest allowed GPU "
            f"type. The org's tier bounds it ({tiers}): outside, a 400.",
        }


# The schema of the submission body and the reference of its validation: the view
# validates with apps.jobs.validation.validate_submit_body, which agrees with this
# serializer (tests/jobs/test_submit_validation.py) at a fraction of its cost. (Not in the
# docstring: that becomes the schema's public description.)
@extend_schema_serializer(
    examples=[
        example("A render", SUBMIT_EXAMPLE, request=True),
        example(
            "The least",
            {"project": "render", "params": {"prompt": "a red fox in snow"}, "max_runtime_s": 60},
            request=True,
        ),
    ]
)
class JobSubmitSerializer(serializers.Serializer):
    """The body of POST /v1/jobs (the Idempotency-Key header is required)."""

    refuses_unknown_fields = True  # _refuse_unknown_fields

    project = serializers.CharField(
        required=False,
        max_length=validation.MAX_PROJECT_LENGTH,
        help_text="Project id or name. Required with a key that is not bound to a project "
        "(a 400 naming `project` without it); a project-bound key may leave it out (its "
        "project) or name its own project (another is a 403). An unknown project is a 400.",
    )
    params = GeneratorParamsField()
    resources = ResourcesSerializer(required=False)
    max_runtime_s = RuntimeField(min_value=1)
    preemptible = serializers.BooleanField(default=True)
    webhook_url = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=validation.MAX_WEBHOOK_URL_LENGTH,
        help_text="Where the job's webhooks go: https, and a host that resolves to no "
        "loopback, private, link-local or metadata address (else a 400). Empty: none.",
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


@extend_schema_serializer(
    examples=[
        example(
            "Queued",
            {
                "at": "2026-01-15T09:30:00Z",
                "from": None,
                "to": "queued",
                "reason": "submitted",
                "actor": "api:gk_3f9a1c2e",
            },
            response=True,
        )
    ]
)
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


@extend_schema_serializer(
    examples=[
        example(
            "The secret",
            {
                "secret": "whsec_4f1d8a2c9e7b3a6d5c0f8e1b2a9d7c3e",
                "signature_header": "X-Gantry-Signature",
                "scheme": 't=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>',
            },
            response=True,
        )
    ]
)
class WebhookSecretSerializer(serializers.Serializer):
    secret = serializers.CharField()
    signature_header = serializers.CharField()
    scheme = serializers.CharField()


@extend_schema_serializer(
    examples=[
        example(
            "Hung on two nodes",
            {
                "fingerprint": "9c1f0e4b7a2d5c8e3f6a1b4d7e0c2f5a8b1d4e7f0a3c6b9d2e5f8a1c4b7d0e3f",
                "reason": "Jobs with these params hung or crashed on 2 different nodes "
                "(threshold 2).",
                "node_count": 2,
                "sample_job": JOB_EXAMPLE["id"],
                "created_at": "2026-01-15T09:30:00Z",
            },
            response=True,
        )
    ]
)
class QuarantinedFingerprintSerializer(serializers.Serializer):
    """A params fingerprint refused at submission (422) since its jobs hung or crashed on
    several nodes."""

    fingerprint = serializers.CharField(help_text="sha256 of the canonical params + resources.")
    reason = serializers.CharField()
    node_count = serializers.IntegerField(help_text="Nodes its attempts hung or crashed on.")
    sample_job = serializers.UUIDField(
        source="sample_job_id", allow_null=True, help_text="The job that tripped it."
    )
    created_at = serializers.DateTimeField()
