# Attempts and GPU assignments point at the fleet app's models (moved from the scheduler;
# same tables, so nothing changes in the database).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0006_fewer_indexes_on_the_submission_path"),
        ("fleet", "0001_fleet_from_scheduler"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.AlterField(
                    model_name="attempt",
                    name="node",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="attempts",
                        to="fleet.node",
                    ),
                ),
                migrations.AlterField(
                    model_name="gpuassignment",
                    name="gpu",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="assignments",
                        to="fleet.gpu",
                    ),
                ),
            ],
        ),
    ]
