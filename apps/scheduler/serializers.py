"""Shapes of the operator's fleet API."""

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from apps.core.errors import GantryError
from apps.core.schema import NOT_BLANK, example
from apps.core.serializers import StrictJSONTypesMixin
from apps.fleet.models import NodeState
from apps.fleet.services import (
    GPU_TYPE_NAME_PATTERN,
    MAX_GPU_MEMORY_GB,
    MAX_GPU_TYPE_NAME_LENGTH,
    MAX_GPUS_PER_NODE,
    MAX_PRICE_PER_GPU_HOUR,
    NODE_NAME_PATTERN,
)


class GpuSpecSerializer(StrictJSONTypesMixin, serializers.Serializer):
    type = serializers.CharField(max_length=32)
    device = serializers.CharField(
        max_length=64, required=False, allow_blank=True, help_text="CUDA device id."
    )


@extend_schema_field(
    {
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_GPUS_PER_NODE,
        "items": {
            "type": "object",
            "required": ["type"],
            "additionalProperties": False,
            "properties": {
                "type": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 32,
                    "pattern": NOT_BLANK,
                    "description": "A GPU type of the fleet (GET /v1/fleet/gpu-types); "
                    "another is a 400 naming gpus[i].type.",
                },
                "device": {"type": "string", "maxLength": 64, "description": "CUDA device id."},
            },
        },
    }
)
class GpuSpecListField(serializers.ListField):
    """The node's GPUs, each {type, device?}; validated by NodeCreateSerializer."""


@extend_schema_serializer(
    examples=[
        example(
            "Two H100s",
            {"name": "h100-2", "gpus": [{"type": "H100"}, {"type": "H100", "device": "1"}]},
            request=True,
        )
    ]
)
class NodeCreateSerializer(StrictJSONTypesMixin, serializers.Serializer):
    name = serializers.RegexField(
        NODE_NAME_PATTERN,
        max_length=100,
        error_messages={"invalid": "Letters, digits, '.', '_' and '-', starting alphanumeric."},
    )
    gpus = GpuSpecListField(
        child=serializers.DictField(), min_length=1, max_length=MAX_GPUS_PER_NODE
    )

    def validate_gpus(self, gpus):
        # Errors name the exact item, e.g. gpus[2].type (DRF would nest them).
        allowed = set(GpuSpecSerializer().fields)
        for i, gpu in enumerate(gpus):
            spec = GpuSpecSerializer(data=gpu)
            if not spec.is_valid():
                field, errors = next(iter(spec.errors.items()))
                raise GantryError(
                    f"gpus[{i}].{field}: {errors[0]}", code="invalid", field=f"gpus[{i}].{field}"
                )
            unknown = sorted(set(gpu) - allowed)
            if unknown:
                raise GantryError(
                    f"gpus[{i}]: unknown key(s) {unknown}; a GPU is {{type, device?}}.",
                    code="invalid",
                    field=f"gpus[{i}]",
                )
        return gpus


class GpuSlotSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    type = serializers.CharField()
    device = serializers.CharField()
    attempt = serializers.UUIDField(allow_null=True, help_text="Live attempt holding it.")
    job = serializers.UUIDField(allow_null=True)
    job_status = serializers.CharField(allow_null=True)


NODE_EXAMPLE = {
    "name": "h100-1",
    "state": "active",
    "queue": "node.h100-1",
    "gpu_count": 2,
    "free_gpus": 1,
    "gpus": [
        {
            "index": 0,
            "type": "H100",
            "device": "0",
            "attempt": "2b7e1f9c-4d3a-4c8e-9a1b-6f0d3e5c7a19",
            "job": "4e8b2c6d-0a1f-4d3e-8b7c-9a5f1e2d6c87",
            "job_status": "running",
        },
        {
            "index": 1,
            "type": "H100",
            "device": "1",
            "attempt": None,
            "job": None,
            "job_status": None,
        },
    ],
    "created_at": "2026-01-15T09:30:00Z",
    "updated_at": "2026-01-15T09:30:00Z",
}


@extend_schema_serializer(examples=[example("A node", NODE_EXAMPLE, response=True)])
class NodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=NodeState.choices)
    queue = serializers.CharField(help_text="Celery queue of the node's worker pool.")
    gpu_count = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
    gpus = GpuSlotSerializer(many=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


GPU_TYPE_EXAMPLE = {
    "name": "H100",
    "memory_gb": 80,
    "price_per_gpu_hour": 4_500_000,
    "gpu_count": 4,
    "free_gpus": 3,
}
# The {name} of /v1/fleet/gpu-types/{name}.
GPU_TYPE_NAME_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_GPU_TYPE_NAME_LENGTH,
    "pattern": GPU_TYPE_NAME_PATTERN,
    "example": "H100",
}


@extend_schema_serializer(
    examples=[example("A GPU type", GPU_TYPE_EXAMPLE, response=True, status_codes=[200, 201])]
)
class GpuTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    memory_gb = serializers.IntegerField()
    price_per_gpu_hour = serializers.IntegerField(help_text="Micro-credits per GPU-hour.")
    gpu_count = serializers.IntegerField()
    free_gpus = serializers.IntegerField()


@extend_schema_serializer(
    examples=[
        example("A new price", {"price_per_gpu_hour": 4_500_000}, request=True),
        example(
            "A new GPU type",
            {"memory_gb": 48, "price_per_gpu_hour": 1_800_000},
            request=True,
        ),
    ]
)
class GpuTypeSetSerializer(StrictJSONTypesMixin, serializers.Serializer):
    memory_gb = serializers.IntegerField(
        min_value=1,
        max_value=MAX_GPU_MEMORY_GB,
        required=False,
        help_text="GB per GPU; required to create a type, optional to change one.",
    )
    price_per_gpu_hour = serializers.IntegerField(
        min_value=0,
        max_value=MAX_PRICE_PER_GPU_HOUR,
        help_text="Micro-credits per GPU-hour, for placements from now on.",
    )


@extend_schema_serializer(
    examples=[
        example(
            "GPU types",
            {
                "results": [
                    {
                        "name": "H100",
                        "memory_gb": 80,
                        "price_per_gpu_hour": 4_000_000,
                        "gpu_count": 4,
                        "free_gpus": 3,
                    }
                ],
                "next": None,
            },
            response=True,
        )
    ]
)
class GpuTypePageSerializer(serializers.Serializer):
    """Every GPU type, on one page (`next` is always null)."""

    results = GpuTypeSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="Always null: one page.")
