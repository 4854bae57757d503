"""Fleet services: load the configured fleet, and the operator's add / drain / remove.

A node's state decides what the dispatcher may do there: only `active` nodes receive
placements; a `draining` node keeps running what it has; a `down` node is out of the
fleet (removed). Placements lock the node row FOR SHARE and re-check its state, and the
state changes here lock it FOR UPDATE, so a drain or removal never races a placement.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError, transaction

from apps.core.errors import Conflict, GantryError
from apps.core.wakeup import wake_dispatcher
from apps.fleet.fleet_file import FleetSpec
from apps.fleet.models import Gpu, GpuType, Node, NodeState

NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MAX_GPUS_PER_NODE = 64


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
