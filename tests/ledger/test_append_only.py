"""Entries are append-only and balanced, enforced by PostgreSQL, not only by Python."""

import importlib
import uuid

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction

from apps.ledger.models import Account, Entry, EntryKind
from tests.ledger.factories import BucketFactory

pytestmark = pytest.mark.django_db

migration = importlib.import_module("apps.ledger.migrations.0002_entry_append_only")


@pytest.fixture
def entry():
    return Entry.objects.filter(bucket=BucketFactory()).first()


def test_the_append_only_trigger_refuses_update_of_an_entry(entry):
    with pytest.raises(DatabaseError, match="append-only: UPDATE refused"), transaction.atomic():
        Entry.objects.filter(pk=entry.pk).update(amount=entry.amount + 1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        entry.memo = "rewritten"
        entry.save()
    entry.refresh_from_db()
    assert entry.memo != "rewritten"


def test_the_append_only_trigger_refuses_delete_of_an_entry(entry):
    with pytest.raises(DatabaseError, match="append-only: DELETE refused"), transaction.atomic():
        Entry.objects.filter(pk=entry.pk).delete()
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM ledger_entry")
    assert Entry.objects.filter(pk=entry.pk).exists()


def test_an_unbalanced_ledger_transaction_is_refused(entry):
    leg = {"org_id": entry.org_id, "bucket_id": entry.bucket_id, "kind": EntryKind.ADJUSTMENT}
    txn = uuid.uuid4()
    with pytest.raises(DatabaseError, match="does not sum to zero"), transaction.atomic():
        Entry.objects.bulk_create(
            [
                Entry(
                    txn=txn,
                    account=Account.ISSUED,
                    counter_account=Account.AVAILABLE,
                    amount=-5,
                    **leg,
                ),
                Entry(
                    txn=txn,
                    account=Account.AVAILABLE,
                    counter_account=Account.ISSUED,
                    amount=4,
                    **leg,
                ),
            ]
        )
    assert not Entry.objects.filter(txn=txn).exists()


@pytest.fixture
def scratch_database():
    """A database not named test_*, as production's is: TRUNCATE must be refused there."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    name = f"gantry_ledger_probe_{uuid.uuid4().hex[:8]}"
    admin = {**params, "dbname": params.get("dbname") or "postgres", "autocommit": True}
    with psycopg.connect(**admin) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(**{**params, "dbname": name, "autocommit": True}) as conn:
            yield conn
    finally:
        with psycopg.connect(**admin) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_truncate_of_the_entries_is_refused_outside_test_databases(scratch_database):
    conn = scratch_database
    conn.execute("CREATE TABLE ledger_entry (id bigserial, txn uuid, amount bigint)")
    conn.execute(migration.FORWARD)
    txn = uuid.uuid4()
    conn.execute("INSERT INTO ledger_entry (txn, amount) VALUES (%s, 5), (%s, -5)", [txn, txn])
    with pytest.raises(psycopg.errors.RestrictViolation, match="TRUNCATE refused"):
        conn.execute("TRUNCATE ledger_entry")
    with pytest.raises(psycopg.errors.RestrictViolation, match="UPDATE refused"):
        conn.execute("UPDATE ledger_entry SET amount = 0")
    assert conn.execute("SELECT count(*) FROM ledger_entry").fetchone()[0] == 2
