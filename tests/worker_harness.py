"""Real Celery GPU-pool workers for end-to-end tests, started and stopped by the tests.

Each worker is `celery -A config worker -Q node.<name> --pool threads` in its own
process group, pointed at pytest-django's test database (so tests using it must be
`transaction=True`: rows are committed and visible to the worker) and at the test
Redis, with short heartbeat/lease/stall settings passed through the environment. The
test process plays the beat: `Beat.tick()` runs one dispatch tick, the lease reaper,
the unclaimed-attempt recovery and the usage fold in-process.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.conf import settings
from django.db import connection

from apps.core.process import signal_on_parent_death

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).parent / "celery")

# Short enough that a crash, a hang or a dead worker shows within seconds.
# Short enough for quick tests, long enough that a loaded 2-core CI machine does not
# lose a lease or see a stall that is only scheduling delay.
FAST_SETTINGS = {
    "GANTRY_HEARTBEAT_S": 0.25,
    "GANTRY_LEASE_S": 10.0,
    "GANTRY_STALL_S": 3.0,
    "GANTRY_PREEMPT_GRACE_S": 2.0,
    "GANTRY_RETRY_BACKOFF_S": 0.1,
    "GANTRY_RETRY_BACKOFF_MAX_S": 0.5,
    "GANTRY_OOM_RETRIES": 1,
    "GANTRY_QUARANTINE_NODES": 2,
    "GANTRY_SCHEDULING_LEASE_S": 30,
    "GANTRY_REPUBLISH_AFTER_S": 1,
    # A capture every 8 heartbeats (the platform's defaults: every 30, once a minute).
    "GANTRY_LEDGER_CAPTURE_INTERVAL_S": 2.0,
}

# A two-node fleet whose queues the workers consume ("node.e2e-h100", "node.e2e-a100").
E2E_FLEET = {
    "gpu_types": {
        "H100": {"memory_gb": 80, "price_per_gpu_hour": 4_000_000},
        "A100": {"memory_gb": 40, "price_per_gpu_hour": 2_500_000},
    },
    "nodes": [
        {"name": "e2e-h100", "gpus": [{"type": "H100"}, {"type": "H100"}]},
        {"name": "e2e-a100", "gpus": [{"type": "A100"}, {"type": "A100"}]},
    ],
}


def libfaketime_path() -> str:
    """The libfaketime shared library shipped in the `libfaketime` wheel."""
    import libfaketime

    return str(
        Path(libfaketime.__file__).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    )


def skewed_clock_env(offset: str) -> dict[str, str]:
    """Environment that shifts a process's wall clock (e.g. "-6h"); monotonic stays real."""
    return {
        "LD_PRELOAD": libfaketime_path(),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


def worker_database_url() -> str:
    """pytest-django's test database (valid once django_db_setup ran), reached the way
    DATABASE_URL reaches its server: TCP or the embedded server's Unix socket."""
    base = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry"))
    return urlunsplit(base._replace(path="/" + connection.settings_dict["NAME"]))


def worker_env(media_root: Path, scratch_root: Path, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in FAST_SETTINGS.items()})
    env.update(
        {
            "DATABASE_URL": worker_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "GANTRY_MEDIA_ROOT": str(media_root),
            "GANTRY_SCRATCH_ROOT": str(scratch_root),
            "GANTRY_DB_CONN_MAX_AGE": "0",
            "GANTRY_LOG_LEVEL": "INFO",
            "DJANGO_SETTINGS_MODULE": "config.settings",
        }
    )
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def die_with_parent() -> None:
    """In the child: get SIGTERM if pytest dies, so no orphan worker steals a later run's jobs."""
    signal_on_parent_death(signal.SIGTERM)


@dataclass
class Process:
    """One process a test starts: its own process group, output to a log file, killed
    if pytest dies (die_with_parent). Every worker and service of the tests is one."""

    name: str
    argv: list[str]
    env: dict
    log_path: Path
    proc: subprocess.Popen | None = None

    def start(self) -> Process:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited:\n{self.log()[-3000:]}")

    def wait_for_line(self, text: str, *, timeout: float = 60.0) -> None:
        """Wait until the log says `text`; raise with the log if it exits or times out."""
        deadline = time.monotonic() + timeout
        while text not in self.log():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {text!r} yet:\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def wait_http_ok(
        self, port: int, path: str, *, host: str = "127.0.0.1", timeout: float = 60.0
    ) -> None:
        """Wait until GET `path` on host:port answers 200; raise with the log if the
        process exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            try:
                conn = http.client.HTTPConnection(host, port, timeout=2)
                conn.request("GET", path)
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def kill9(self) -> None:
        """SIGKILL the process alone (not its group), as a crashed host would lose it."""
        if self.alive:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self) -> None:
        """Ask the process group to stop (see stop)."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self, *, grace: float = 10.0) -> None:
        """Stop the process group: SIGTERM, SIGKILL after `grace` seconds (at once for 0)."""
        if self.proc is None:
            return
        if grace:
            self.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def celery_worker_argv(
    *, queue: str, hostname: str, pool: str, concurrency: int = 1, heartbeat: bool = False
) -> list:
    """`celery worker` consuming one queue, with nothing that slows a test's start; with
    `heartbeat`, it sends a worker-heartbeat event every 2 s (what Flower hears)."""
    return [
        CELERY,
        "-A",
        "config",
        "worker",
        "--queues",
        queue,
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--prefetch-multiplier",
        "1",
        "--hostname",
        hostname,
        "--without-gossip",
        "--without-mingle",
        *(() if heartbeat else ("--without-heartbeat",)),
        "--loglevel",
        "INFO",
    ]


@dataclass
class Worker(Process):
    """One GPU-pool worker process (one node, `slots` concurrent runs)."""

    node: str = ""
    slots: int = 1
    hostname: str = ""
    heartbeat: bool = False

    def start(self, *, timeout: float = 60.0) -> Worker:
        return self.launch().wait_ready(timeout=timeout)

    def launch(self) -> Worker:
        """Start the process without waiting for it (see wait_ready); a new Celery name
        unless it was given one (a restart under its old name)."""
        self.hostname = self.hostname or f"{self.node}@e2e-{uuid.uuid4().hex[:8]}"
        self.argv = celery_worker_argv(
            queue=f"node.{self.node}",
            hostname=self.hostname,
            pool="threads",
            concurrency=self.slots,
            heartbeat=self.heartbeat,
        )
        Process.start(self)
        return self

    def wait_ready(self, *, timeout: float = 60.0) -> Worker:
        self.wait_for_line(f"{self.hostname} ready.", timeout=timeout)
        return self

    def stop(self, *, grace: float = 0.0) -> None:
        """Kill the worker and everything of its process group at once; reap it."""
        Process.stop(self, grace=grace)


def control_worker(tmp: Path, *, extra_env: dict | None = None) -> Process:
    """A started, ready `celery worker -Q control --pool solo` on the test database and
    Redis (its queue emptied first: stale control messages of earlier tests are not
    ours). The caller stops it."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).delete("control")
    hostname = f"control-test@{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DATABASE_URL": worker_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "GANTRY_DB_CONN_MAX_AGE": "0",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        **(extra_env or {}),
    }
    argv = celery_worker_argv(queue="control", hostname=hostname, pool="solo")
    worker = Process("control worker", argv, env, tmp / f"control-{hostname}.log").start()
    worker.wait_for_line(f"{hostname} ready.")
    return worker


@dataclass
class WorkerPool:
    """The workers of one test module; stopped at its end."""

    tmp: Path
    workers: list[Worker] = field(default_factory=list)

    @property
    def media_root(self) -> Path:
        return self.tmp / "media"

    @property
    def scratch_root(self) -> Path:
        return self.tmp / "scratch"

    def start(self, node: str, *, slots: int = 2, extra_env: dict | None = None) -> Worker:
        return self.launch(node, slots=slots, extra_env=extra_env).wait_ready()

    def launch(
        self,
        node: str,
        *,
        slots: int = 2,
        extra_env: dict | None = None,
        hostname: str = "",
        heartbeat: bool = False,
    ) -> Worker:
        env = worker_env(self.media_root, self.scratch_root, extra_env)
        log_path = self.tmp / f"worker-{node}-{len(self.workers)}.log"
        worker = Worker(
            f"worker {node}",
            [],
            env,
            log_path,
            node=node,
            slots=slots,
            hostname=hostname,
            heartbeat=heartbeat,
        )
        self.workers.append(worker)
        return worker.launch()

    def stop_node(self, node: str) -> None:
        """Stop the workers of one node and forget them."""
        for worker in [w for w in self.workers if w.node == node]:
            worker.stop()
            self.workers.remove(worker)

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {w.hostname}\n{w.log()[-4000:]}" for w in self.workers)


def pool_fixture(*nodes: str, scope: str = "module"):
    """A pytest fixture yielding a WorkerPool with one running worker per node given."""

    @pytest.fixture(scope=scope)
    def workers(django_db_setup, tmp_path_factory):
        pool = WorkerPool(tmp_path_factory.mktemp("workers"))
        pool.media_root.mkdir()
        pool.scratch_root.mkdir()
        try:
            for worker in [pool.launch(node) for node in nodes]:  # start up side by side
                worker.wait_ready()
            yield pool
        finally:
            pool.stop_all()

    return workers


@dataclass
class ApiServer(Process):
    """The API as `make up` serves it (gunicorn, uvicorn workers, config.asgi), on the
    test database: for what the in-process test client cannot show (streams)."""

    url: str = ""

    @classmethod
    def launch(cls, pool: WorkerPool, *, workers: int = 1, public_url: bool = False) -> ApiServer:
        """Start it on a free port and wait until /readyz answers; with `public_url`,
        the links it hands out (results) point at this server."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [
            str(Path(sys.executable).parent / "gunicorn"),
            "config.asgi:application",
            *("--config", str(ROOT / "config" / "gunicorn.py"), "--bind", f"127.0.0.1:{port}"),
            *("--workers", str(workers)),
        ]
        env = worker_env(
            pool.media_root, pool.scratch_root, {"GANTRY_PUBLIC_URL": url} if public_url else None
        )
        server = cls("api", argv, env, pool.tmp / "api.log", url=url)
        server.start()
        server.wait_http_ok(port, "/readyz")
        return server


def apply_fast_settings(settings_fixture, pool: WorkerPool) -> None:
    """Give the test process (the beat, in-process services) the workers' settings."""
    for name, value in FAST_SETTINGS.items():
        setattr(settings_fixture, name, value)
    settings_fixture.MEDIA_ROOT = pool.media_root
    settings_fixture.GANTRY_CHECKPOINT_ROOT = pool.media_root / "checkpoints"
    settings_fixture.GANTRY_SCRATCH_ROOT = pool.scratch_root


def load_e2e_fleet(document: dict | None = None) -> None:
    from apps.fleet import selectors
    from apps.fleet.fleet_file import parse_fleet
    from apps.fleet.services import load_fleet

    load_fleet(parse_fleet(json.loads(json.dumps(document or E2E_FLEET))))
    selectors.clear_gpu_type_cache()


def flush_test_redis() -> None:
    redis.Redis.from_url(settings.REDIS_URL).flushdb()


class Beat:
    """The periodic tasks, run in the test process on demand."""

    def __init__(self, *, dispatch: bool = True):
        self.dispatch = dispatch

    @classmethod
    def over(cls, pool: WorkerPool, settings_fixture, *, fleet: dict | None = None) -> Beat:
        """A beat for a test on `pool`: the workers' settings in this process, an empty
        test Redis and the fleet (the e2e fleet by default) loaded."""
        apply_fast_settings(settings_fixture, pool)
        flush_test_redis()
        load_e2e_fleet(fleet)
        return cls()

    def drain(self, *, timeout: float, dispatch: bool = False) -> None:
        """Tick (placing queued jobs too with `dispatch`) until every attempt has
        finished: no run of one test is left for the next."""
        from apps.jobs.models import Attempt, AttemptState

        Beat(dispatch=dispatch).until(
            lambda: not Attempt.objects.exclude(state=AttemptState.FINISHED).exists(),
            timeout=timeout,
        )

    def tick(self) -> None:
        from apps.jobs.services import recovery
        from apps.ledger import services as ledger
        from apps.scheduler.services.dispatch import run_dispatch_tick
        from apps.scheduler.services.recovery import republish_unclaimed_attempts

        recovery.reap_expired_leases()
        republish_unclaimed_attempts()
        if self.dispatch:
            run_dispatch_tick()
        ledger.fold_usage_reports()

    def until(
        self, condition: Callable[[], bool], *, timeout: float = 30.0, every: float = 0.1
    ) -> None:
        """Tick until `condition()` holds; fail with the state after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            if condition():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout} s")
            time.sleep(every)


def job_now(job):
    """The job as the database has it now (the workers change it behind the test's back)."""
    from apps.jobs.models import Job

    return Job.objects.get(pk=job.pk)


def submit_job(org, *, prompt: str, steps: int = 5, step_seconds: float = 0.05, **spec):
    """Submit through the jobs service (validation, hold, queued event) like the API does."""
    from apps.jobs.services.spec import JobSpec
    from apps.jobs.services.submission import submit_job

    project = org.projects.first()
    if project is None:
        from tests.factories import ProjectFactory

        project = ProjectFactory(org=org)
    params = {"prompt": prompt, "seed": 7, "steps": steps, "step_seconds": step_seconds}
    spec.setdefault("max_runtime_s", 120)
    spec.setdefault("gpu_types", ("H100",))
    job_spec = JobSpec(params=params, **spec)
    return submit_job(org=org, project=project, spec=job_spec, allow_dedup=False).job
