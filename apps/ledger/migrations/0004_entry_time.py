"""An index on ledger entries by (created_at, id), for the audit trail's ledger source:
newest first across all orgs when not filtered by org or job (GET /v1/audit and the
admin's audit page). Without it such a page sorts every entry to return a few.

Partial (amount > 0): the audit trail lists only the positive leg of each movement, so
the index holds half the rows and costs half the writes on the hottest insert of all.
It also keeps an org's listing (GET /v1/ledger/entries, which has no amount filter) on
entry_org_time: a full (created_at, id) index is chosen there too, and then walks
every other org's entries to find this one's.

Built CONCURRENTLY (hence a non-atomic migration): a plain CREATE INDEX would hold
every ledger write for the whole build.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("ledger", "0003_write_path")]

    operations = [
        AddIndexConcurrently(
            model_name="entry",
            index=models.Index(
                condition=models.Q(("amount__gt", 0)),
                fields=["created_at", "id"],
                name="entry_time",
            ),
        ),
    ]
