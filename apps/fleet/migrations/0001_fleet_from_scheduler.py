# The fleet's models moved here from the scheduler app. State only: the tables keep the
# names the scheduler gave them (scheduler_gputype, scheduler_node, scheduler_gpu);
# jobs.0007 and scheduler.0004 point their foreign keys here and drop the old state.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [("scheduler", "0003_fencing_token_sequence")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name="GpuType",
                    fields=[
                        (
                            "name",
                            models.CharField(max_length=32, primary_key=True, serialize=False),
                        ),
                        ("memory_gb", models.PositiveIntegerField()),
                        (
                            "price_per_gpu_hour",
                            models.BigIntegerField(help_text="Micro-credits per GPU-hour."),
                        ),
                    ],
                    options={
                        "db_table": "scheduler_gputype",
                        "verbose_name": "GPU type",
                        "ordering": ("-price_per_gpu_hour", "name"),
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(("price_per_gpu_hour__gte", 0)),
                                name="gputype_price_nonneg",
                            ),
                            models.CheckConstraint(
                                condition=models.Q(("memory_gb__gt", 0)),
                                name="gputype_memory_positive",
                            ),
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Node",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=100, unique=True)),
                        (
                            "state",
                            models.CharField(
                                choices=[
                                    ("active", "Active"),
                                    ("draining", "Draining"),
                                    ("down", "Down"),
                                ],
                                default="active",
                                max_length=16,
                            ),
                        ),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        "db_table": "scheduler_node",
                        "ordering": ("name",),
                        "constraints": [
                            models.CheckConstraint(
                                condition=models.Q(("name__regex", "^[A-Za-z0-9][A-Za-z0-9_.-]*$")),
                                name="node_name_queue_safe",
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="Gpu",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "index",
                            models.PositiveSmallIntegerField(
                                help_text="Position on the node (CUDA device index)."
                            ),
                        ),
                        (
                            "device_id",
                            models.CharField(
                                blank=True,
                                help_text="What CUDA_VISIBLE_DEVICES gets (index if blank).",
                                max_length=64,
                            ),
                        ),
                        (
                            "gpu_type",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="gpus",
                                to="fleet.gputype",
                            ),
                        ),
                        (
                            "node",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="gpus",
                                to="fleet.node",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "scheduler_gpu",
                        "verbose_name": "GPU",
                        "ordering": ("node__name", "index"),
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("node", "index"), name="gpu_index_per_node"
                            )
                        ],
                    },
                ),
            ],
        ),
    ]
