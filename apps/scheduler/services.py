"""Fleet services: load the configured fleet into the database."""

from __future__ import annotations

from django.db import transaction

from apps.scheduler.fleet import FleetSpec
from apps.scheduler.models import Gpu, GpuType, Node


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
