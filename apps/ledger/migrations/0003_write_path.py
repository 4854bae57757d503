"""The write path's database side.

- ledger_raise(): lets a single write statement refuse itself. The services send their
  one write statement and the COMMIT together (one round trip), so whatever must stop
  the commit (a hard budget exceeded, a lock that was not held) is checked inside that
  statement and raised from it, which aborts the transaction.
- Free space in the pages of the rows updated on every reservation, settlement and
  heartbeat fold, so PostgreSQL can update them in place (HOT: no index writes).
"""

from django.db import migrations

UPDATED_IN_PLACE = [
    "ledger_bucket",
    "ledger_hold",
    "ledger_holdallocation",
    "ledger_usagemark",
    "ledger_budget",
]

FORWARD = """
CREATE OR REPLACE FUNCTION ledger_raise(code text, message text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = message;
END;
$$;
""" + "".join(f"ALTER TABLE {table} SET (fillfactor = 70);\n" for table in UPDATED_IN_PLACE)

BACKWARD = "DROP FUNCTION IF EXISTS ledger_raise(text, text);\n" + "".join(
    f"ALTER TABLE {table} RESET (fillfactor);\n" for table in UPDATED_IN_PLACE
)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_entry_append_only")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
