"""Budget lanes (see Budget.lane_of) and the hold's lane number.

Every existing budget becomes a budget of one lane whose share is its whole limit."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0002_operator_action"),
        ("ledger", "0006_bucket_lanes"),
    ]

    operations = [
        migrations.AddField(
            model_name="hold",
            name="lane",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="budget",
            name="lane",
            field=models.SmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="budget",
            name="lanes",
            field=models.SmallIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name="budget",
            name="lane_of",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                help_text="The budget's first lane, for its other lanes; empty for the first.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="other_lanes",
                to="ledger.budget",
            ),
        ),
        migrations.AddField(
            model_name="budget",
            name="share",
            field=models.BigIntegerField(
                default=0, help_text="This lane's part of a hard limit."
            ),
            preserve_default=False,
        ),
        migrations.RunSQL('UPDATE ledger_budget SET share = "limit"', migrations.RunSQL.noop),
        migrations.AddField(
            model_name="budget",
            name="unbalanced",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AlterModelOptions(
            name="budget",
            options={"ordering": ("org", "project", "user", "lane")},
        ),
        migrations.RemoveConstraint(model_name="budget", name="budget_per_scope"),
        migrations.AddConstraint(
            model_name="budget",
            constraint=models.UniqueConstraint(
                fields=("org", "project", "user", "lane"),
                name="budget_lane_per_scope",
                nulls_distinct=False,
            ),
        ),
        migrations.AddConstraint(
            model_name="budget",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        models.Q(("lane", 0), ("lane_of__isnull", True)),
                        models.Q(("lane__gt", 0), ("lane_of__isnull", False)),
                        _connector="OR",
                    ),
                    ("lane__lt", models.F("lanes")),
                    ("share__gte", 0),
                ),
                name="budget_lane_valid",
            ),
        ),
    ]
