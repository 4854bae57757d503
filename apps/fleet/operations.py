"""Operators' fleet changes, each recorded as an OperatorAction in its transaction.

The admin and the operator API both call these (see apps.accounts.operations for the
`actor` and `record_refused` conventions); the changes themselves are the fleet
services' (apps.fleet.services).
"""

from __future__ import annotations

from collections.abc import Sequence

from apps.accounts.operator_actions import operator_action
from apps.fleet import services
from apps.fleet.models import Node, NodeState


def add_node(*, actor: str, name: str, gpus: Sequence[dict], record_refused: bool = True) -> Node:
    """Add an active node with its GPUs, recorded as node.add with the node as added."""
    with operator_action(
        actor=actor,
        action="node.add",
        target_type="node",
        target_id=name,
        record_refused=record_refused,
    ) as pending:
        node = services.add_node(name=name, gpus=gpus)
        pending.after = node_snapshot(node.pk)
    return node


def drain_node(*, actor: str, name: str, record_refused: bool = True) -> Node:
    with _state_change(actor, "node.drain", name, record_refused) as pending:
        node = services.drain_node(name=name)
        pending.after = {"state": node.state}
    return node


def undrain_node(*, actor: str, name: str, record_refused: bool = True) -> Node:
    with _state_change(actor, "node.undrain", name, record_refused) as pending:
        node = services.undrain_node(name=name)
        pending.after = {"state": node.state}
    return node


def remove_node(*, actor: str, name: str, record_refused: bool = True) -> bool:
    """Remove a node (services.remove_node), recorded as node.remove; after is `deleted`
    or `down` (kept for its history). Returns True if the row was deleted."""
    with _state_change(actor, "node.remove", name, record_refused) as pending:
        deleted = services.remove_node(name=name)
        pending.after = {"state": "deleted" if deleted else NodeState.DOWN}
    return deleted


def set_gpu_type(
    *,
    actor: str,
    name: str,
    price_per_gpu_hour: int,
    memory_gb: int | None = None,
    record_refused: bool = True,
) -> services.GpuTypeChange:
    """Create or change a GPU type (services.set_gpu_type), recorded as gpu_type.update
    with its memory and price before ({} for a new type) and after; setting the values it
    has already records nothing."""
    with operator_action(
        actor=actor,
        action="gpu_type.update",
        target_type="gpu_type",
        target_id=name,
        record_refused=record_refused,
    ) as pending:
        change = services.set_gpu_type(
            name=name, memory_gb=memory_gb, price_per_gpu_hour=price_per_gpu_hour
        )
        pending.before = change.before or {}
        pending.after = change.after
        pending.skip = not change.changed
    return change


def _state_change(actor: str, action: str, name: str, record_refused: bool):
    return operator_action(
        actor=actor,
        action=action,
        target_type="node",
        target_id=name,
        before=Node.objects.filter(name=name).values("state").first() or {},
        record_refused=record_refused,
    )


def node_snapshot(pk) -> dict:
    """A node as the audit trail records it: name, state and GPUs in index order."""
    node = Node.objects.filter(pk=pk).first()
    if node is None:
        return {}
    gpus = node.gpus.order_by("index").values_list("index", "gpu_type_id", "device_id")
    return {
        "name": node.name,
        "state": node.state,
        "gpus": [{"index": i, "type": t, "device": d} for i, t, d in gpus],
    }
