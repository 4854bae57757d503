# Partial indexes for two foreign keys that are almost always NULL (a deduplicated job's
# source, an event's attempt): a submission writes no entry into either.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0003_idempotentrequest_to_core'),
        ('jobs', '0011_job_webhook_events'),
        ('ledger', '0008_session_lane_sequence'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='reused_from',
            field=models.ForeignKey(blank=True, db_index=False, help_text='Deduplicated: the earlier successful job whose result this one returns.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='jobs.job'),
        ),
        migrations.AlterField(
            model_name='jobevent',
            name='attempt',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, to='jobs.attempt'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('reused_from__isnull', False)), fields=['reused_from'], name='job_reused_from'),
        ),
        migrations.AddIndex(
            model_name='jobevent',
            index=models.Index(condition=models.Q(('attempt__isnull', False)), fields=['attempt'], name='jobevent_attempt'),
        ),
    ]
