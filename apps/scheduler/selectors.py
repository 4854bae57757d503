"""Reads of the fleet for operators: nodes with their GPUs and what runs on each."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Count, Q, QuerySet

from apps.fleet.models import Gpu, GpuType, Node, NodeState
from apps.jobs.models import GpuAssignment
from apps.scheduler.models import DispatchDecision


def nodes(*, state: str | None = None) -> QuerySet[Node]:
    """All nodes (removed ones too: state down), optionally of one state, by name."""
    queryset = Node.objects.order_by("name")
    return queryset.filter(state=state) if state else queryset


def node_by_name(name: str) -> Node | None:
    return Node.objects.filter(name=name).first()


def describe_nodes(page: Sequence[Node]) -> list[dict]:
    """Each node with its GPUs and, per GPU, the live attempt and job holding it.

    Two queries for the whole page, whatever its size."""
    node_ids = [node.pk for node in page]
    gpus_by_node: dict[int, list[dict]] = {pk: [] for pk in node_ids}
    for gpu_id, node_id, index, gpu_type, device in (
        Gpu.objects.filter(node_id__in=node_ids)
        .order_by("node_id", "index")
        .values_list("id", "node_id", "index", "gpu_type_id", "device_id")
    ):
        gpus_by_node[node_id].append(
            {
                "id": gpu_id,
                "index": index,
                "type": gpu_type,
                "device": device or str(index),
                "attempt": None,
                "job": None,
                "job_status": None,
            }
        )
    holders = {
        gpu_id: (attempt_id, job_id, status)
        for gpu_id, attempt_id, job_id, status in GpuAssignment.objects.filter(
            gpu__node_id__in=node_ids, released_at__isnull=True
        ).values_list("gpu_id", "attempt_id", "attempt__job_id", "attempt__job__status")
    }
    out = []
    for node in page:
        gpus = gpus_by_node[node.pk]
        for gpu in gpus:
            held = holders.get(gpu.pop("id"))
            if held:
                gpu["attempt"], gpu["job"], gpu["job_status"] = (
                    str(held[0]),
                    str(held[1]),
                    held[2],
                )
        out.append(
            {
                "name": node.name,
                "state": node.state,
                "queue": node.queue,
                "gpu_count": len(gpus),
                "free_gpus": sum(1 for gpu in gpus if gpu["attempt"] is None),
                "gpus": gpus,
                "created_at": node.created_at,
                "updated_at": node.updated_at,
            }
        )
    return out


def gpu_types_with_counts(*, name: str | None = None) -> list[dict]:
    """GPU types (or the one named), priciest first, with GPUs in the fleet (not removed)
    and free now."""
    # isnull=False first: a GPU never assigned also reads released_at NULL in the outer join.
    live = Q(gpus__assignments__isnull=False, gpus__assignments__released_at__isnull=True)
    in_fleet = ~Q(gpus__node__state=NodeState.DOWN)
    types = GpuType.objects.filter(name=name) if name is not None else GpuType.objects.all()
    rows = (
        types.annotate(
            gpu_count=Count("gpus", filter=in_fleet, distinct=True),
            busy=Count("gpus", filter=in_fleet & live, distinct=True),
        )
        .order_by("-price_per_gpu_hour", "name")  # Meta.ordering is dropped under GROUP BY
        .values_list("name", "memory_gb", "price_per_gpu_hour", "gpu_count", "busy")
    )
    return [
        {
            "name": name,
            "memory_gb": memory,
            "price_per_gpu_hour": price,
            "gpu_count": count,
            "free_gpus": count - busy,
        }
        for name, memory, price, count, busy in rows
    ]


def decisions_for_job(job_id) -> QuerySet[DispatchDecision]:
    """The dispatcher's decisions about one job (placed, or preempting for it), newest first."""
    return DispatchDecision.objects.filter(Q(job_id=job_id) | Q(victims__contains=[job_id]))
