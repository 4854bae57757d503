"""config.postgresql: the per-request health check runs only on a connection that idled,
and a connection broken while in use is still replaced after the request that finds it.

The server side of a connection is really terminated (pg_terminate_backend); each
`close_if_unusable_or_obsolete()` call stands for a request boundary, as Django's
request_started / request_finished handlers make it.
"""

import psycopg
import pytest
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, transaction

from apps.core.sql import execute
from config.postgresql.base import HEALTH_CHECK_AFTER_IDLE_S

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def db():
    db = connections[DEFAULT_DB_ALIAS]
    assert db.settings_dict["CONN_HEALTH_CHECKS"]
    db.close_if_unusable_or_obsolete()  # a request starts
    db.ensure_connection()
    return db


def terminate_server_side(db) -> None:
    pid = db.connection.info.backend_pid
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
    finally:
        other.close()


def select_one(db) -> int:
    with db.cursor() as cursor:
        cursor.execute("SELECT 1")
        return cursor.fetchone()[0]


def test_a_connection_in_steady_use_is_not_pinged(db):
    select_one(db)
    db.close_if_unusable_or_obsolete()  # the request ends, the next one starts
    pid = db.connection.info.backend_pid
    assert not db.health_check_done
    select_one(db)
    assert db.health_check_done  # counted as checked, without a ping
    assert db.connection.info.backend_pid == pid


def test_an_idle_connection_is_pinged_and_replaced_before_use(db):
    select_one(db)
    db.close_if_unusable_or_obsolete()
    old_pid = db.connection.info.backend_pid
    terminate_server_side(db)
    db.last_request_use -= HEALTH_CHECK_AFTER_IDLE_S + 1  # as if it idled meanwhile
    assert select_one(db) == 1  # the ping failed, a new connection served the query
    assert db.connection.info.backend_pid != old_pid


def test_a_connection_broken_in_use_fails_one_request_then_is_replaced(db):
    select_one(db)
    db.close_if_unusable_or_obsolete()
    terminate_server_side(db)
    with pytest.raises(OperationalError):
        select_one(db)
    db.close_if_unusable_or_obsolete()  # the failed request ends: the connection is dropped
    assert db.connection is None
    assert select_one(db) == 1


def test_the_hot_paths_raw_statements_drop_a_broken_connection_too(db):
    select_one(db)
    db.close_if_unusable_or_obsolete()
    old_pid = db.connection.info.backend_pid
    terminate_server_side(db)
    with pytest.raises(psycopg.OperationalError), transaction.atomic():
        execute(db.connection, "SELECT 1", [])
    # The block's rollback failed on the dead connection, so Django dropped it (and
    # leaving the block, which turns autocommit back on, connected anew).
    db.close_if_unusable_or_obsolete()
    assert select_one(db) == 1
    assert db.connection.info.backend_pid != old_pid
