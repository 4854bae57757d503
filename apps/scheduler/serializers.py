"""Shapes of the operator's fleet API."""

from rest_framework import serializers

from apps.core.errors import GantryError
from apps.fleet.models import NodeState
from apps.fleet.services import MAX_GPUS_PER_NODE, NODE_NAME_PATTERN


class GpuSpecSerializer(serializers.Serializer):
    type = serializers.CharField(max_length=32)
    device = serializers.CharField(
        max_length=64, required=False, allow_blank=True, help_text="CUDA device id."
    )


class NodeCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(
        NODE_NAME_PATTERN,
        max_length=100,
        error_messages={"invalid": "Letters, digits, '.', '_' and '-', starting alphanumeric."},
    )
    gpus = serializers.ListField(
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


class NodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=NodeState.choices)
    queue = serializers.CharField(help_text="Celery queue of the node's worker pool.")
    gpu_count = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
    gpus = GpuSlotSerializer(many=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class GpuTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    memory_gb = serializers.IntegerField()
    price_per_gpu_hour = serializers.IntegerField(help_text="Micro-credits per GPU-hour.")
    gpu_count = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
