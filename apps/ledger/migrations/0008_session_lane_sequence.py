"""The sequence that numbers database sessions for their lane (services.holds.preferred_lane).

Consecutive numbers for the sessions as they connect spread concurrent sessions evenly
over the lanes; backend pids, used before, are spaced by whatever else forked between
them (client threads take ids from the same space) and often shared a lane."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("ledger", "0007_budget_lanes")]

    operations = [
        migrations.RunSQL(
            "CREATE SEQUENCE ledger_session_lane AS integer CYCLE",
            reverse_sql="DROP SEQUENCE ledger_session_lane",
        )
    ]
