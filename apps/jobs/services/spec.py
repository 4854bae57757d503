"""A job's spec and its price: what a tenant asks for, checked without a lock.

validate_spec checks everything that needs no lock (every refusal a 400 naming the
field) and answers the GPU types the job may run on; hold_amount prices the hold from
them; fingerprint_of is what dedup and quarantine match on.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from django.conf import settings

from apps.core.errors import GantryError
from apps.fleet import selectors as fleet
from apps.fleet.selectors import GpuTypeInfo
from apps.jobs.models import DEFAULT_WEBHOOK_EVENTS, Job
from apps.jobs.services import webhooks
from apps.jobs.validation import MAX_GPU_COUNT


@dataclass(frozen=True)
class JobSpec:
    """What a tenant asks for (validated by validate_spec)."""

    params: dict
    max_runtime_s: int
    gpu_count: int = 1
    gpu_types: tuple[str, ...] = ()
    min_gpu_memory_gb: int = 0
    preemptible: bool = True
    webhook_url: str = ""
    # What the webhook is sent for (WebhookEvent values). Not part of the fingerprint
    # either: it says whom to tell, not what to run.
    webhook_events: tuple[str, ...] = DEFAULT_WEBHOOK_EVENTS
    # Seconds from submission to start by, else cancelled (deadline_exceeded); None: none.
    # Not part of the fingerprint: it says when to run, not what.
    start_deadline_s: int | None = None

    @property
    def resources(self) -> dict:
        return {
            "gpu_count": self.gpu_count,
            "gpu_types": list(self.gpu_types),
            "min_gpu_memory_gb": self.min_gpu_memory_gb,
        }


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_of(spec: JobSpec) -> str:
    """sha256 of the canonical params + resources: what dedup and quarantine match on."""
    document = canonical_json({"params": spec.params, "resources": spec.resources})
    return hashlib.sha256(document.encode()).hexdigest()


def request_digest_of(body) -> str:
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def spec_of(job: Job) -> JobSpec:
    """The spec a job was submitted with (for a requeued copy). Its start deadline is
    not carried: it was relative to the original submission, and an operator who runs
    the job again wants it run."""
    return JobSpec(
        params=job.params,
        max_runtime_s=job.max_runtime_s,
        gpu_count=job.gpu_count,
        gpu_types=tuple(job.gpu_types),
        min_gpu_memory_gb=job.min_gpu_memory_gb,
        preemptible=job.preemptible,
        webhook_url=job.webhook_url,
        webhook_events=tuple(job.webhook_events),
    )


def allowed_gpu_types(spec: JobSpec) -> list[GpuTypeInfo]:
    """The GPU types the job may run on (listed ones, or all), that meet its memory floor.

    Raises a 400 naming `resources.gpu_types` for an unknown type and
    `resources.min_gpu_memory_gb` when no allowed type has that much memory.
    """
    types = fleet.gpu_types()
    if any(name not in types for name in spec.gpu_types):
        types = fleet.gpu_types(refresh=True)  # a type added since the cache filled
    unknown = [name for name in spec.gpu_types if name not in types]
    if unknown:
        raise GantryError(
            f"resources.gpu_types: unknown GPU type {unknown[0]!r}; "
            f"known: {', '.join(sorted(types)) or 'none'}.",
            code="invalid",
            field="resources.gpu_types",
        )
    candidates = [types[name] for name in spec.gpu_types] if spec.gpu_types else types.values()
    allowed = [t for t in candidates if t.memory_gb >= spec.min_gpu_memory_gb]
    if not allowed:
        best = max((t.memory_gb for t in candidates), default=0)
        raise GantryError(
            f"resources.min_gpu_memory_gb: no allowed GPU type has {spec.min_gpu_memory_gb} GB "
            f"(the most is {best} GB).",
            code="invalid",
            field="resources.min_gpu_memory_gb",
        )
    return allowed


def validate_spec(spec: JobSpec, *, tier: str) -> list[GpuTypeInfo]:
    """Check everything about the spec that does not need a lock; the allowed GPU types.

    Every refusal is a 400 naming the field.
    """
    if not isinstance(spec.params, dict):
        raise GantryError("params: expected an object.", code="invalid", field="params")
    size = len(canonical_json(spec.params).encode())
    if size > settings.GANTRY_MAX_PARAMS_BYTES:
        raise GantryError(
            f"params: {size} bytes is more than the {settings.GANTRY_MAX_PARAMS_BYTES} allowed.",
            code="invalid",
            field="params",
        )
    if not 1 <= spec.gpu_count <= MAX_GPU_COUNT:
        raise GantryError(
            f"resources.gpu_count: must be between 1 and {MAX_GPU_COUNT}.",
            code="invalid",
            field="resources.gpu_count",
        )
    limits = settings.GANTRY_TIER_RUNTIME_LIMITS[tier]
    low, high = limits["min_runtime_s"], limits["max_runtime_s"]
    if not low <= spec.max_runtime_s <= high:
        raise GantryError(
            f"max_runtime_s: the {tier} tier allows {low} to {high} seconds.",
            code="invalid",
            field="max_runtime_s",
        )
    allowed = allowed_gpu_types(spec)
    if spec.webhook_url:
        webhooks.check_target(spec.webhook_url)
    return allowed


def hold_amount(spec: JobSpec, allowed: list[GpuTypeInfo]) -> int:
    """Micro-credits to hold: the whole runtime on the priciest allowed type, rounded up."""
    price = max(t.price_per_gpu_hour for t in allowed)
    return max(1, math.ceil(spec.max_runtime_s * spec.gpu_count * price / 3600))
