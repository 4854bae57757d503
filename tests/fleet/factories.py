"""Fleet rows for every test: the demo GPU types, nodes with or without GPUs."""

from __future__ import annotations

import uuid

import factory

from apps.fleet.models import Gpu, GpuType, Node

H100_PRICE = 4_000_000
A100_PRICE = 2_500_000


def gpu_types() -> dict[str, GpuType]:
    """The demo fleet's GPU types: H100 80 GB at 4 credits/h, A100 40 GB at 2.5."""
    h100, _ = GpuType.objects.update_or_create(
        name="H100", defaults={"memory_gb": 80, "price_per_gpu_hour": H100_PRICE}
    )
    a100, _ = GpuType.objects.update_or_create(
        name="A100", defaults={"memory_gb": 40, "price_per_gpu_hour": A100_PRICE}
    )
    return {"H100": h100, "A100": a100}


def unique_name(prefix: str = "node") -> str:
    """Node names unique across test runs sharing one Redis (queues are named after them)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class BareNodeFactory(factory.django.DjangoModelFactory):
    """A node with no GPUs (add them with GpuFactory)."""

    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"node-{n}")


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(BareNodeFactory)
    index = factory.Sequence(lambda n: n)
    gpu_type_id = "H100"


class NodeFactory(factory.django.DjangoModelFactory):
    """A node with GPUs: NodeFactory(gpus=4, gpus__type="A100") (default one H100)."""

    class Meta:
        model = Node
        skip_postgeneration_save = True

    name = factory.LazyFunction(unique_name)

    @factory.post_generation
    def gpus(node, create, extracted, type="H100", **kwargs):
        if not create:
            return
        gpu_types()
        count = 1 if extracted is None else extracted
        Gpu.objects.bulk_create(
            Gpu(node=node, index=i, gpu_type_id=type, device_id=f"GPU-{node.name}-{i}")
            for i in range(count)
        )
