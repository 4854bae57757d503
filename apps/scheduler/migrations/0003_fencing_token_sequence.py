from django.db import migrations

# Fencing tokens come from one sequence, so they grow globally across all jobs and
# dispatchers: a claim presenting an older token than the attempt's is always stale.
# nextval() is never rolled back, so a skipped decision leaves a gap, never a reuse.
CREATE = "CREATE SEQUENCE IF NOT EXISTS scheduler_fencing_token_seq AS bigint START 1"
DROP = "DROP SEQUENCE IF EXISTS scheduler_fencing_token_seq"


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0002_dispatch_audit_usage")]

    operations = [migrations.RunSQL(CREATE, DROP)]
