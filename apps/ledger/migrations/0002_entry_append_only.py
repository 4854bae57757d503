"""Ledger entries are append-only and balanced, enforced by PostgreSQL itself.

- UPDATE and DELETE of an entry raise, always.
- TRUNCATE raises too, except in a database named test_* (Django's test-database
  convention): the test runner empties every table with TRUNCATE between transactional
  tests, and a production database is never named so.
- Every INSERT statement must balance per ledger transaction (txn): the services write
  each transaction's legs with one INSERT, so its entries sum to zero.
"""

from django.db import migrations

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_entry_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' AND current_database() LIKE 'test\_%' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'ledger entries are append-only: % refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER ledger_entry_no_update_delete
    BEFORE UPDATE OR DELETE ON ledger_entry
    FOR EACH ROW EXECUTE FUNCTION ledger_entry_refuse_change();

CREATE TRIGGER ledger_entry_no_truncate
    BEFORE TRUNCATE ON ledger_entry
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entry_refuse_change();

CREATE OR REPLACE FUNCTION ledger_entry_check_balanced() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    unbalanced uuid;
BEGIN
    SELECT txn INTO unbalanced FROM inserted GROUP BY txn HAVING sum(amount) <> 0 LIMIT 1;
    IF unbalanced IS NOT NULL THEN
        RAISE EXCEPTION 'ledger transaction % does not sum to zero', unbalanced
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER ledger_entry_balanced
    AFTER INSERT ON ledger_entry
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_entry_check_balanced();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS ledger_entry_balanced ON ledger_entry;
DROP FUNCTION IF EXISTS ledger_entry_check_balanced();
DROP TRIGGER IF EXISTS ledger_entry_no_truncate ON ledger_entry;
DROP TRIGGER IF EXISTS ledger_entry_no_update_delete ON ledger_entry;
DROP FUNCTION IF EXISTS ledger_entry_refuse_change();
"""


class Migration(migrations.Migration):
    dependencies = [("ledger", "0001_initial")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
