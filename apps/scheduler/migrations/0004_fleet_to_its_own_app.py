# GPU types, nodes and GPUs now belong to the fleet app (fleet.0001); their tables stay.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0003_fencing_token_sequence"),
        ("fleet", "0001_fleet_from_scheduler"),
        ("jobs", "0007_fleet_foreign_keys"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.AlterField(
                    model_name="nodeclaim",
                    name="node",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="fleet.node",
                    ),
                ),
                migrations.DeleteModel(name="Gpu"),
                migrations.DeleteModel(name="Node"),
                migrations.DeleteModel(name="GpuType"),
            ],
        ),
    ]
