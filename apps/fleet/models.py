"""The GPU fleet, the inventory: GPU types with prices, nodes, and the GPUs on each node.

Below the ledger and the jobs, so a job can be priced without the scheduler. The tables
were created by the scheduler app and keep their names.
"""

from django.db import models
from django.db.models import Q


class GpuType(models.Model):
    name = models.CharField(max_length=32, primary_key=True)
    memory_gb = models.PositiveIntegerField()
    price_per_gpu_hour = models.BigIntegerField(help_text="Micro-credits per GPU-hour.")

    class Meta:
        db_table = "scheduler_gputype"  # created by the scheduler app; the table is kept
        ordering = ("-price_per_gpu_hour", "name")
        verbose_name = "GPU type"
        constraints = [
            models.CheckConstraint(
                condition=Q(price_per_gpu_hour__gte=0), name="gputype_price_nonneg"
            ),
            models.CheckConstraint(condition=Q(memory_gb__gt=0), name="gputype_memory_positive"),
        ]

    def __str__(self):
        return f"{self.name} ({self.memory_gb} GB)"


class NodeState(models.TextChoices):
    ACTIVE = "active", "Active"
    DRAINING = "draining", "Draining"  # runs what it has, gets nothing new
    DOWN = "down", "Down"


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "scheduler_node"
        ordering = ("name",)
        constraints = [
            models.CheckConstraint(
                condition=Q(name__regex=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"),
                name="node_name_queue_safe",
            )
        ]

    def __str__(self):
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue this node's worker pool consumes."""
        return node_queue(self.name)


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="Position on the node (CUDA device index).")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="gpus")
    device_id = models.CharField(
        max_length=64, blank=True, help_text="What CUDA_VISIBLE_DEVICES gets (index if blank)."
    )

    class Meta:
        db_table = "scheduler_gpu"
        ordering = ("node__name", "index")
        verbose_name = "GPU"
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_index_per_node")]

    def __str__(self):
        return f"{self.node.name}:{self.index} ({self.gpu_type_id})"

    @property
    def visible_device(self) -> str:
        return self.device_id or str(self.index)
