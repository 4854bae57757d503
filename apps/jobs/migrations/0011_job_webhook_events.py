# The webhook_events submission field: which of start, progress and completed a job's
# webhook is sent for. Existing jobs, and rows inserted by code that predates the column,
# get ["completed"] (what a webhook always was); a check refuses any other name.

import django.contrib.postgres.fields
from django.db import migrations, models

import apps.jobs.models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0010_job_start_deadline'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='webhook_events',
            field=django.contrib.postgres.fields.ArrayField(base_field=models.CharField(choices=[('start', 'Start'), ('progress', 'Progress'), ('completed', 'Completed')], max_length=16), blank=True, db_default=['completed'], default=apps.jobs.models.default_webhook_events, help_text='What the webhook is sent for: start, progress, completed.', size=None),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('webhook_events__contained_by', ['start', 'progress', 'completed'])), name='job_webhook_events_known'),
        ),
    ]
