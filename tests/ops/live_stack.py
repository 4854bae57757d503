"""A running slice of the platform for the metrics and logging tests (fixtures `stack`, `ops`).

Built from the launcher's own command lines (scripts/stack.py) and pointed at the test
database and Redis: the API under gunicorn (two worker processes, one multiprocess
metrics directory), the control worker (prefork, two children: it runs the dispatch
ticks, woken by submissions and by the test, which plays the beat), one GPU-pool worker
of tests/worker_harness.py, and Flower. Every Celery worker serves /metrics on its own
port, as under `make up`. Started once for the tests/ops package (the fixtures are
imported by tests/ops/conftest.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from apps.jobs.models import Attempt, Job
from tests.factories import ProjectFactory, org_key
from tests.jobs.factories import funded_org
from tests.worker_harness import (
    ROOT,
    Process,
    Worker,
    WorkerPool,
    apply_fast_settings,
    flush_test_redis,
    load_e2e_fleet,
    worker_env,
)

NODE = "e2e-h100"


def load_launcher():
    """scripts/stack.py as a module (it is a script, not part of a package)."""
    spec = importlib.util.spec_from_file_location("gantry_stack", ROOT / "scripts" / "stack.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


stack_py = load_launcher()


# --------------------------------------------------------------------------- scraping


Samples = dict[tuple[str, frozenset], float]


def scrape(url: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by (name, labels)."""
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (our own test URL)
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels) -> float:
    """The sample with exactly these labels, 0 when the series has not appeared yet."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include these."""
    wanted = set(labels.items())
    return sum(v for (n, lbls), v in samples.items() if n == name and wanted <= lbls)


# --------------------------------------------------------------------------- processes


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_for(condition: Callable[[], bool], *, what: str, timeout: float = 60.0, check=None):
    """Poll `condition` every 0.1 s; `check()` may raise to give up early."""
    deadline = time.monotonic() + timeout
    while not condition():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.1)


def gunicorn_workers(master_pid: int) -> set[int]:
    """Pids of the gunicorn master's worker processes."""
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return {int(pid) for pid in children}


@dataclass
class Stack:
    api: Process
    control: Process
    flower: Process
    gpu_worker: Worker
    api_port: int
    control_metrics_port: int
    node_metrics_port: int
    flower_port: int
    pool: WorkerPool
    control_hostname: str = ""
    services: list[Process] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def scrape_api(self) -> Samples:
        return scrape(f"{self.api_url}/metrics")

    def scrape_control(self) -> Samples:
        return scrape(f"http://127.0.0.1:{self.control_metrics_port}/metrics")

    def scrape_node(self) -> Samples:
        return scrape(f"http://127.0.0.1:{self.node_metrics_port}/metrics")

    def scrape_flower(self) -> Samples:
        return scrape(f"http://127.0.0.1:{self.flower_port}/metrics")

    def logs(self) -> str:
        parts = [f"--- {s.name}\n{s.log()[-3000:]}" for s in self.services]
        return "\n".join([*parts, self.pool.logs()])

    def tick(self) -> None:
        """Play the beat: ask the control worker for a dispatch tick."""
        from config.celery import app

        app.send_task("gantry.scheduler.dispatch_tick", queue="control", expires=5)

    def until(self, condition: Callable[[], bool], *, timeout: float = 30.0, during=None):
        """Tick every 0.3 s until `condition()`; `during()` is called at every poll."""
        deadline = time.monotonic() + timeout
        next_tick = 0.0
        while not condition():
            now = time.monotonic()
            if now >= next_tick:
                self.tick()
                next_tick = now + 0.3
            if during is not None:
                during()
            if now > deadline:
                raise AssertionError(f"condition not met within {timeout} s\n{self.logs()}")
            time.sleep(0.1)

    def wait_idle(self, *, timeout: float = 20.0) -> None:
        """Wait until no task is queued for or running in the workers: a tick or a run's
        last writes still going when the test database is flushed could deadlock it."""
        from config.celery import app

        hosts = [self.control_hostname, self.gpu_worker.hostname]
        queues = ["control", f"node.{self.gpu_worker.node}"]
        broker = redis.Redis.from_url(settings.REDIS_URL)
        inspector = app.control.inspect(destination=hosts, timeout=2)

        def idle() -> bool:
            if any(broker.llen(queue) for queue in queues):
                return False
            active, reserved = inspector.active() or {}, inspector.reserved() or {}
            replied = set(active) == set(hosts) == set(reserved)
            return replied and not any([*active.values(), *reserved.values()])

        wait_for(lambda: idle() and idle(), what="workers idle", timeout=timeout)

    def submit(self, key: str, body: dict, *, request_id: str = "") -> tuple[int, dict]:
        """POST /v1/jobs through gunicorn: (status, JSON answer)."""
        headers = {
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Idempotency-Key": uuid.uuid4().hex,
        }
        if request_id:
            headers["X-Request-Id"] = request_id
        request = urllib.request.Request(  # noqa: S310
            f"{self.api_url}/v1/jobs", data=json.dumps(body).encode(), headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:  # noqa: S310
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")


def distinct_free_ports(count: int) -> list[int]:
    """`count` different free ports: each probe stays bound until all are chosen (probes
    closed one by one can hand out the same port twice)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


@pytest.fixture(scope="package")
def stack(django_db_setup, tmp_path_factory):
    """The running slice (see the module docstring), stopped at the end of the package."""
    tmp = tmp_path_factory.mktemp("ops-stack")
    pool = WorkerPool(tmp)
    pool.media_root.mkdir()
    pool.scratch_root.mkdir()
    flush_test_redis()
    api_port, control_port, node_port, flower_port = distinct_free_ports(4)
    base_env = worker_env(pool.media_root, pool.scratch_root)

    def metrics_dir(name: str) -> str:
        directory = tmp / "metrics" / name
        directory.mkdir(parents=True)
        return str(directory)

    api = Process(
        "api",
        stack_py.api_process(port=api_port, workers=2),
        # The test loads the fleet after the API started: read GPU types every time.
        {
            **base_env,
            "PROMETHEUS_MULTIPROC_DIR": metrics_dir("api"),
            "GANTRY_GPU_TYPE_CACHE_S": "0",
            # Result links point at this API, as `make up` sets it.
            "GANTRY_PUBLIC_URL": f"http://127.0.0.1:{api_port}",
        },
        tmp / "api.log",
    )
    control_hostname = f"control@ops-{uuid.uuid4().hex[:8]}"
    control = Process(
        "control",
        stack_py.control_worker(hostname=control_hostname),
        {
            **base_env,
            "PROMETHEUS_MULTIPROC_DIR": metrics_dir("control"),
            "GANTRY_METRICS_PORT": str(control_port),
        },
        tmp / "control.log",
    )
    flower = Process(
        "flower", stack_py.flower_process(port=flower_port), base_env, tmp / "flower.log"
    )
    services = [api, control, flower]
    try:
        for service in services:
            service.start()
        gpu_worker = pool.launch(
            NODE,
            slots=2,
            # One process (threads): its own registry, as the launcher runs it.
            extra_env={"GANTRY_METRICS_PORT": str(node_port)},
            heartbeat=True,  # so that Flower hears it, whenever its receiver joins
        )
        gpu_worker.wait_ready()
        wait_for(
            lambda: f"{control_hostname} ready." in control.log(),
            what="control worker ready",
            check=control.check_alive,
        )
        for service, url in (
            (api, f"http://127.0.0.1:{api_port}/healthz"),
            (control, f"http://127.0.0.1:{control_port}/metrics"),
            (flower, f"http://127.0.0.1:{flower_port}/metrics"),
        ):
            wait_for(
                lambda url=url: http_ok(url),
                what=f"{service.name} at {url}",
                check=service.check_alive,
            )
        # Their own servers, not another process's on those ports: a scrape of the wrong
        # process reads series that never move.
        for worker, port in ((gpu_worker, node_port), (control, control_port)):
            wait_for(
                lambda worker=worker, port=port: (
                    f"metrics on http://127.0.0.1:{port}/metrics" in worker.log()
                ),
                what=f"{worker.name}'s metrics server",
                check=worker.check_alive,
            )
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{node_port}/metrics"), what="node worker metrics"
        )
        # Flower's web server answers before its event receiver has joined the broker's
        # fan-out, and events sent before that are never seen: wait until it has heard
        # one of the GPU worker's heartbeats (fresh-ci once ran a job before that, and
        # Flower never showed it).
        wait_for(
            lambda: (
                value(
                    scrape(f"http://127.0.0.1:{flower_port}/metrics"),
                    "flower_worker_online",
                    worker=gpu_worker.hostname,
                )
                == 1
            ),
            what="Flower hearing the GPU worker's events",
            check=flower.check_alive,
        )
        yield Stack(
            api=api,
            control=control,
            flower=flower,
            gpu_worker=gpu_worker,
            api_port=api_port,
            control_metrics_port=control_port,
            node_metrics_port=node_port,
            flower_port=flower_port,
            pool=pool,
            control_hostname=control_hostname,
            services=services,
        )
    finally:
        for service in services:  # all at once, then wait for each
            service.terminate()
        pool.stop_all()
        for service in services:
            service.stop()


@pytest.fixture
def ops(stack, settings):
    """Per test: the e2e fleet loaded and fast settings in this process; at the end, no
    attempt of the test left running for the next one."""
    apply_fast_settings(settings, stack.pool)
    load_e2e_fleet()
    yield stack
    stack.until(lambda: not Attempt.objects.exclude(state="finished").exists(), timeout=20)
    stack.wait_idle()


@dataclass
class Tenant:
    org: object
    project: object
    key: str


def on_live_stack(test):
    """A test that runs jobs through the live slice of the platform: e2e, committed rows."""
    return pytest.mark.e2e(pytest.mark.django_db(transaction=True)(test))


def make_tenant(**org_fields) -> Tenant:
    org = funded_org(**org_fields)
    project = ProjectFactory(org=org)
    return Tenant(org=org, project=project, key=org_key(org))


def job_body(tenant: Tenant, *, prompt: str, steps: int = 5, step_seconds: float = 0.05) -> dict:
    return {
        "project": str(tenant.project.pk),
        "params": {"prompt": prompt, "seed": 7, "steps": steps, "step_seconds": step_seconds},
        "resources": {"gpu_count": 1, "gpu_types": ["H100"]},
        "max_runtime_s": 120,
        "preemptible": True,
    }


def terminal(*job_ids) -> Callable[[], bool]:
    return lambda: all(Job.objects.get(pk=pk).is_terminal for pk in job_ids)
