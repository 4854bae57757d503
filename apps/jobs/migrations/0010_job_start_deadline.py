# The start_deadline_s submission field: when a queued job that never started is
# cancelled (deadline_exceeded), and the partial index the sweep reads it by.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0009_scoped_idempotency_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='start_deadline_at',
            field=models.DateTimeField(blank=True, help_text='Not started by then: cancelled, nothing charged.', null=True),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('start_deadline_at__isnull', False), ('status', 'queued')), fields=['start_deadline_at'], name='job_start_deadline'),
        ),
    ]
