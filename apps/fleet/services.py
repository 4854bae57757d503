"""Fleet services: load the configured fleet, the operator's add / drain / remove, and
GPU types with their prices.

A node's state decides what the dispatcher may do there: only `active` nodes receive
placements; a `draining` node keeps running what it has; a `down` node is out of the
fleet (removed). Placements lock the node row FOR SHARE and re-check its state, and the
state changes here lock it FOR UPDATE, so a drain or removal never races a placement.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from apps.core.errors import Conflict, GantryError
from apps.core.wakeup import wake_dispatcher
from apps.fleet.fleet_file import FleetSpec
from apps.fleet.models import Gpu, GpuType, Node, NodeState
from apps.fleet.selectors import clear_gpu_type_cache

NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MAX_GPUS_PER_NODE = 64
GPU_TYPE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MAX_GPU_TYPE_NAME_LENGTH = 32  # GpuType.name
MAX_GPU_MEMORY_GB = 1_000_000
# Micro-credits per GPU-hour (a million credits): a hold of the longest run (7 days) on 8
# GPUs at this price is about 1.3e15 micro-credits, far inside BIGINT and exact in the
# float arithmetic of apps.jobs.services.spec.hold_amount.
MAX_PRICE_PER_GPU_HOUR = 10**12


@transaction.atomic
def load_fleet(spec: FleetSpec) -> list[Node]:
    """Make the database hold the fleet of `spec`; running it again changes nothing.

    GPU types are created or re-priced; listed nodes are created with their GPUs.
    Nodes already present keep their state and GPUs; nodes not in the spec are left
    to the operator (drain/remove).
    """
    for name, (memory_gb, price) in spec.gpu_types.items():
        GpuType.objects.update_or_create(
            name=name, defaults={"memory_gb": memory_gb, "price_per_gpu_hour": price}
        )
    nodes = []
    for name, gpus in spec.nodes:
        node, created = Node.objects.get_or_create(name=name)
        if created:
            Gpu.objects.bulk_create(
                Gpu(node=node, index=i, gpu_type_id=kind, device_id=device)
                for i, (kind, device) in enumerate(gpus)
            )
        nodes.append(node)
    return nodes


def add_node(*, name: str, gpus: Sequence[dict]) -> Node:
    """Create an active node with `gpus` ([{"type", "device"?}], indexed in order).

    Bad input is a GantryError naming the field (e.g. `gpus[2].type` for an unknown
    type); an existing name (even of a removed node: undrain brings it back) is a 409.
    The node gets work from the next dispatch tick; its worker pool consumes
    `node.<name>`.
    """
    known = set(GpuType.objects.values_list("name", flat=True))
    rows = []
    for i, gpu in enumerate(gpus):
        kind = gpu.get("type")
        if kind not in known:
            raise GantryError(
                f"Unknown GPU type {kind!r}; known: {', '.join(sorted(known)) or 'none'}.",
                code="invalid",
                field=f"gpus[{i}].type",
            )
        rows.append((kind, str(gpu.get("device") or "")))
    try:
        with transaction.atomic():
            node = Node.objects.create(name=name, state=NodeState.ACTIVE)
            Gpu.objects.bulk_create(
                Gpu(node=node, index=i, gpu_type_id=kind, device_id=device)
                for i, (kind, device) in enumerate(rows)
            )
    except IntegrityError as exc:
        raise Conflict(f"A node named {name!r} already exists.", field="name") from exc
    _wake()
    return node


def drain_node(*, name: str) -> Node:
    """Stop new placements on the node; what runs there keeps running. Idempotent.

    A removed (down) node cannot be drained: 409."""
    with transaction.atomic():
        node = _locked(name)
        if node.state == NodeState.DOWN:
            raise Conflict(f"Node {name} is removed; undrain it to bring it back.", field="state")
        if node.state != NodeState.DRAINING:
            node.state = NodeState.DRAINING
            node.save(update_fields=["state", "updated_at"])
    return node


def undrain_node(*, name: str) -> Node:
    """Make the node active again (from draining, or from removed); it gets work from
    the next tick. Idempotent."""
    with transaction.atomic():
        node = _locked(name)
        if node.state != NodeState.ACTIVE:
            node.state = NodeState.ACTIVE
            node.save(update_fields=["state", "updated_at"])
    _wake()
    return node


def remove_node(*, name: str) -> bool:
    """Take the node out of the fleet, only if nothing holds any of its GPUs (else 409).

    A node that never ran anything is deleted with its GPUs. A node with attempts in its
    history is kept as `down` (attempts, GPU assignments and prices stay intact and
    readable); it gets no work and no worker pool. Returns True if the row was deleted.
    """
    with transaction.atomic():
        node = _locked(name)
        # Through the reverse relations: the fleet sits below jobs and does not import them.
        live = node.gpus.filter(
            assignments__isnull=False, assignments__released_at__isnull=True
        ).count()
        if live:
            raise Conflict(
                f"Node {name} still has {live} GPU(s) in use; drain it first and remove it "
                "once its jobs have finished.",
                code="node_busy",
                field="name",
            )
        if node.attempts.exists():
            node.state = NodeState.DOWN
            node.save(update_fields=["state", "updated_at"])
            return False
        node.delete()
        return True


def _locked(name: str) -> Node:
    node = Node.objects.select_for_update().filter(name=name).first()
    if node is None:
        raise GantryError(f"No node named {name!r}.", code="not_found", status_code=404)
    return node


def _wake() -> None:
    wake_dispatcher()


@dataclass(frozen=True)
class GpuTypeChange:
    """What set_gpu_type did: the type as it now is, and its values before (None: new)."""

    gpu_type: GpuType
    before: dict | None

    @property
    def created(self) -> bool:
        return self.before is None

    @property
    def after(self) -> dict:
        return gpu_type_values(self.gpu_type)

    @property
    def changed(self) -> bool:
        return self.before != self.after


def gpu_type_values(gpu_type: GpuType) -> dict:
    return {"memory_gb": gpu_type.memory_gb, "price_per_gpu_hour": gpu_type.price_per_gpu_hour}


def check_gpu_type(
    *, memory_gb: int | None, price_per_gpu_hour: int, name: str | None = None
) -> None:
    """Refuse GPU type values the fleet cannot hold, as a GantryError (400) naming the
    field: a memory of 1 to MAX_GPU_MEMORY_GB GB, a price of 0 to MAX_PRICE_PER_GPU_HOUR
    micro-credits and, when given (a new type's), a name of 1 to 32 letters, digits, '.',
    '_' and '-', starting alphanumeric. (Types loaded from a fleet file keep their names.)"""
    if name is not None and (
        len(name) > MAX_GPU_TYPE_NAME_LENGTH or not re.fullmatch(GPU_TYPE_NAME_PATTERN, name)
    ):
        raise GantryError(
            f"name: 1 to {MAX_GPU_TYPE_NAME_LENGTH} letters, digits, '.', '_' and '-', "
            "starting alphanumeric.",
            code="invalid",
            field="name",
        )
    if memory_gb is not None and not _integer_in(memory_gb, 1, MAX_GPU_MEMORY_GB):
        raise GantryError(
            f"memory_gb: an integer from 1 to {MAX_GPU_MEMORY_GB}.",
            code="invalid",
            field="memory_gb",
        )
    if not _integer_in(price_per_gpu_hour, 0, MAX_PRICE_PER_GPU_HOUR):
        raise GantryError(
            f"price_per_gpu_hour: an integer from 0 to {MAX_PRICE_PER_GPU_HOUR} "
            "(micro-credits per GPU-hour).",
            code="invalid",
            field="price_per_gpu_hour",
        )


def _integer_in(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def set_gpu_type(
    *, name: str, price_per_gpu_hour: int, memory_gb: int | None = None
) -> GpuTypeChange:
    """Create the GPU type `name` (`memory_gb` then required) or change its price (and
    memory, when given). Bad values (and a new type's bad name) are a 400 naming the
    field (check_gpu_type).

    Prices apply to placements from now on: a running attempt keeps the price it was
    placed at, and a submission's hold reads the new price at once in this process and
    within GANTRY_GPU_TYPE_CACHE_S in the others. Locks the type's row; two concurrent
    creations of one name: the second is a 409."""
    check_gpu_type(memory_gb=memory_gb, price_per_gpu_hour=price_per_gpu_hour)
    with transaction.atomic():
        gpu_type = None
        if len(name) <= MAX_GPU_TYPE_NAME_LENGTH:  # longer: none can exist
            gpu_type = GpuType.objects.select_for_update().filter(name=name).first()
        if gpu_type is None:
            check_gpu_type(name=name, memory_gb=memory_gb, price_per_gpu_hour=price_per_gpu_hour)
            if memory_gb is None:
                raise GantryError(
                    f"memory_gb: required to create the GPU type {name!r}.",
                    code="invalid",
                    field="memory_gb",
                )
            try:
                with transaction.atomic():
                    gpu_type = GpuType.objects.create(
                        name=name, memory_gb=memory_gb, price_per_gpu_hour=price_per_gpu_hour
                    )
            except IntegrityError as exc:
                raise Conflict(
                    f"The GPU type {name!r} was created meanwhile; retry.", field="name"
                ) from exc
            before = None
        else:
            before = gpu_type_values(gpu_type)
            gpu_type.price_per_gpu_hour = price_per_gpu_hour
            if memory_gb is not None:
                gpu_type.memory_gb = memory_gb
            if gpu_type_values(gpu_type) != before:
                gpu_type.save(update_fields=["memory_gb", "price_per_gpu_hour"])
        transaction.on_commit(clear_gpu_type_cache)
    return GpuTypeChange(gpu_type=gpu_type, before=before)
