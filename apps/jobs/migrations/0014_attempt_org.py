"""Each attempt carries its job's org (copied at placement), so that an org's spend over
a window (the admin's org list: 24 hours, 30 days, GPU-hours) reads that org's recent
attempts, not every job the org ever ran. Existing attempts take their job's org."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0003_idempotentrequest_to_core"),
        ("jobs", "0013_job_recent_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="org",
            field=models.ForeignKey(
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="attempts",
                to="accounts.org",
            ),
        ),
        migrations.RunSQL(
            "UPDATE jobs_attempt a SET org_id = j.org_id FROM jobs_job j "
            "WHERE j.id = a.job_id AND a.org_id IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="attempt",
            name="org",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="attempts",
                to="accounts.org",
            ),
        ),
    ]
