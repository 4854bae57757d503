"""apps.core.sql.execute_last: the COMMIT travels with the last statement of the outermost
atomic block, and Django's transaction handling stays right around it."""

import psycopg
import pytest
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg.pq import TransactionStatus

from apps.core.sql import execute_last

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def db_wrapper():
    db = connections[DEFAULT_DB_ALIAS]
    with db.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE parent (id int PRIMARY KEY)")
        cursor.execute(
            "CREATE TEMP TABLE child (parent_id int REFERENCES parent DEFERRABLE "
            "INITIALLY DEFERRED)"
        )
    yield db
    with db.cursor() as cursor:
        cursor.execute("DROP TABLE child, parent")


def count(db, table: str) -> int:
    with db.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 (a test's own table)
        return cursor.fetchone()[0]


def test_the_outermost_blocks_last_statement_commits_with_it(db_wrapper):
    hooks = []
    with transaction.atomic():
        transaction.on_commit(lambda: hooks.append("ran"))
        execute_last(db_wrapper, "INSERT INTO parent VALUES (%s)", [1])
        # Committed by this very round trip, before the block's exit.
        assert db_wrapper.connection.info.transaction_status == TransactionStatus.IDLE
        assert hooks == []
    assert hooks == ["ran"]  # Django still ran the on_commit callbacks, once
    assert db_wrapper.get_autocommit()
    assert count(db_wrapper, "parent") == 1


def test_a_commit_that_fails_raises_in_the_block_and_keeps_nothing(db_wrapper):
    hooks = []
    with pytest.raises(psycopg.errors.ForeignKeyViolation), transaction.atomic():
        transaction.on_commit(lambda: hooks.append("ran"))
        execute_last(db_wrapper, "INSERT INTO child VALUES (%s)", [7])  # no parent 7
    assert hooks == []
    assert db_wrapper.get_autocommit()
    assert count(db_wrapper, "child") == 0  # and the connection still works


def test_inside_a_savepoint_the_outer_block_decides(db_wrapper):
    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        with transaction.atomic():
            execute_last(db_wrapper, "INSERT INTO parent VALUES (%s)", [2])
        assert db_wrapper.connection.info.transaction_status == TransactionStatus.INTRANS
        raise Undo
    assert count(db_wrapper, "parent") == 0
