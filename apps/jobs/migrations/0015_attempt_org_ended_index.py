"""An index on attempts by (org, finished_at): an org's attempts still running (NULL)
or ended since a time, for the admin's org list. Built CONCURRENTLY (a non-atomic
migration), as the attempts table is written by every placement and end."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0014_attempt_org")]

    operations = [
        AddIndexConcurrently(
            model_name="attempt",
            index=models.Index(fields=["org", "finished_at"], name="attempt_org_ended"),
        ),
    ]
