"""An index on jobs by (created_at, id), for the operators' list of every org's jobs,
newest first (the admin). Without it the page sorts every job to show a hundred: a
quarter of a second at 100,000 jobs, seconds at millions. A tenant's own list stays on
job_org_recent (org first).

Built CONCURRENTLY (hence a non-atomic migration): a plain CREATE INDEX would hold every
submission for the whole build.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("jobs", "0012_partial_rare_fk_indexes")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["created_at", "id"], name="job_recent"),
        ),
    ]
