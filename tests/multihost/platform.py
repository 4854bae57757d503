"""Gantry spread over the bed's hosts, each running what `make up` runs on one machine.

    services    PostgreSQL 18, Valkey (broker, accumulators), moto's S3 server
    api-1/2     gunicorn (config/gunicorn.py) on <address>:8000
    control-1/2 celery beat (one leads: apps.core.beat) and the control worker
    gpu-1/2/3   the GPU-pool worker of the node of the same name (2 GPUs, stand-in)

No filesystem is shared: every host has its own media and scratch folders; results and
checkpoints live in the object store. Timings are short so that a lost host shows within
seconds (`TIMINGS`); what they bound is stated beside them.
"""

from __future__ import annotations

import http.client
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg
import redis

from gantry_client.api import GantryAPI
from tests.multihost.bed import (
    Bed,
    boto_credentials,
    manage,
    start_object_store,
    start_postgres,
    start_valkey,
    wait_until,
    write_fleet,
)
from tests.ops.live_stack import stack_py
from tests.s3_server import FAKE_CREDENTIALS

API_HOSTS = ("api-1", "api-2")
CONTROL_HOSTS = ("control-1", "control-2")
GPU_HOSTS = ("gpu-1", "gpu-2", "gpu-3")
HOSTS = ("services", *API_HOSTS, *CONTROL_HOSTS, *GPU_HOSTS)
GPUS_PER_NODE = 2
API_PORT = 8000
METRICS_PORT = 9310  # a GPU worker's /metrics, as in docker-compose.yml

TIMINGS = {
    "GANTRY_HEARTBEAT_S": "0.5",
    # A running attempt not renewed for this long is lost (reaped, the job resumes).
    "GANTRY_LEASE_S": "6",
    # A worker that stops pulsing is silent after 3 pulses: no new work is sent there.
    "GANTRY_WORKER_PULSE_S": "1",
    # A silent holder of the beat's or the dispatcher's lock loses it after this long.
    "GANTRY_LOCK_IDLE_TIMEOUT_S": "3",
    # Any wait on a dead link to PostgreSQL ends after this long.
    "GANTRY_DB_LINK_TIMEOUT_S": "3",
    "GANTRY_RECOVERY_INTERVAL_S": "1",
    "GANTRY_SCHEDULING_LEASE_S": "20",
    "GANTRY_REPUBLISH_AFTER_S": "2",
    "GANTRY_LEDGER_CAPTURE_INTERVAL_S": "2",
    "GANTRY_STALL_S": "30",
    "GANTRY_PREEMPT_GRACE_S": "2",
    "GANTRY_RETRY_BACKOFF_S": "0.1",
    "GANTRY_RETRY_BACKOFF_MAX_S": "0.5",
    "GANTRY_DB_CONN_MAX_AGE": "0",
    "GANTRY_LOG_LEVEL": "INFO",
}


@dataclass
class Platform:
    bed: Bed
    env: dict[str, str]
    s3_endpoint: str
    operator: GantryAPI | None = None
    tenant: GantryAPI | None = None
    org_id: str = ""
    project_id: str = ""
    figures: list[str] = field(default_factory=list)

    # -- the pieces ---------------------------------------------------------------------

    @property
    def database_url(self) -> str:
        return self.env["DATABASE_URL"]

    def api_url(self, host: str) -> str:
        return f"http://{self.bed.hosts[host].address}:{API_PORT}"

    def api(self, host: str, *, timeout: float = 10.0) -> GantryAPI:
        """The tenant's client, talking to one API host."""
        return GantryAPI(self.api_url(host), self.tenant.api_key, timeout=timeout)

    def host_env(self, host: str, **extra: str) -> dict[str, str]:
        folder = self.bed.root / "hosts" / host
        return {
            **self.env,
            "GANTRY_MEDIA_ROOT": str(folder / "media"),
            "GANTRY_SCRATCH_ROOT": str(folder / "scratch"),
            **extra,
        }

    def sql(self, query: str, params=()) -> list[tuple]:
        """A read of the platform's database, as an operator at a psql prompt."""
        with psycopg.connect(self.database_url.replace("postgres://", "postgresql://")) as conn:
            return conn.execute(query, params).fetchall()

    def log(self, host: str, name: str) -> str:
        path = self.bed.root / "logs" / f"{host}-{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def scrape(self, host: str) -> str:
        """The /metrics of `host`'s GPU worker, as Prometheus scrapes that target."""
        conn = http.client.HTTPConnection(self.bed.hosts[host].address, METRICS_PORT, timeout=5)
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()

    def pulse(self, node: str) -> dict | None:
        """The node's liveness pulse, as the fleet page reads it (apps.fleet.liveness)."""
        raw = redis.Redis.from_url(self.env["REDIS_URL"]).get(f"gantry:node-pulse:{node}")
        return json.loads(raw) if raw else None

    def check_alive(self) -> None:
        for process in self.bed.processes:
            process.check_alive()

    def reconcile(self) -> str:
        """The ledger's reconciler (all invariants); raises on any violation."""
        return manage(self.env, "reconcile_ledger", "--no-record")

    def result_bytes(self, job_id: str) -> bytes:
        import boto3

        client = boto3.client(
            "s3", endpoint_url=self.s3_endpoint, **boto_credentials(FAKE_CREDENTIALS)
        )
        (key,) = self.sql("SELECT result_path FROM jobs_job WHERE id = %s", [job_id])[0]
        prefix = self.env.get("GANTRY_S3_PREFIX", "results/")
        return client.get_object(Bucket="gantry", Key=prefix + key)["Body"].read()

    # -- jobs ---------------------------------------------------------------------------

    def submit(self, host: str, *, prompt: str, steps: int, step_seconds: float, key: str = ""):
        spec = self.spec(prompt=prompt, steps=steps, step_seconds=step_seconds)
        return self.api(host).submit_job(spec, idempotency_key=key or os.urandom(8).hex())

    @staticmethod
    def spec(*, prompt: str, steps: int, step_seconds: float) -> dict:
        return {
            "params": {"prompt": prompt, "seed": 11, "steps": steps, "step_seconds": step_seconds},
            "resources": {"gpu_count": 1, "gpu_types": ["H100"]},
            "max_runtime_s": 600,
        }

    def job(self, job_id: str) -> dict:
        return self.api("api-2").get_job(job_id)

    def wait_jobs(self, job_ids: list[str], status: str, *, timeout: float) -> None:
        wait_until(
            lambda: all(self.job(j)["status"] == status for j in job_ids),
            what=f"jobs {status}",
            timeout=timeout,
            check=self.check_alive,
            every=0.5,
        )


def start_platform(bed: Bed) -> Platform:
    """Services, schema, fleet, operator and tenant, then every host's processes, ready."""
    database_url = start_postgres(bed, "services")
    redis_url = start_valkey(bed, "services")
    s3_endpoint = start_object_store(bed, "services", FAKE_CREDENTIALS)
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GANTRY_", "PROMETHEUS_"))
        and k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL")
    }
    env = {
        **inherited,
        **FAKE_CREDENTIALS,
        **TIMINGS,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "GANTRY_SECRET_KEY": "multihost-" + os.urandom(24).hex(),
        "GANTRY_ALLOWED_HOSTS": "*",
        "GANTRY_RESULT_STORAGE": "s3",
        "GANTRY_S3_BUCKET": "gantry",
        "GANTRY_S3_ENDPOINT_URL": s3_endpoint,
        "GANTRY_S3_REGION": FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
        "GANTRY_FLEET_FILE": str(write_fleet(bed, dict.fromkeys(GPU_HOSTS, GPUS_PER_NODE))),
    }
    platform = Platform(bed=bed, env=env, s3_endpoint=s3_endpoint)
    manage(env, "migrate", "--verbosity", "0")
    manage(env, "load_fleet")
    operator_key = manage(env, "create_operator_key").strip().splitlines()[-1]

    api_servers = {}
    for host in API_HOSTS:
        argv = stack_py.api_process(port=API_PORT, workers=1, address=bed.hosts[host].address)
        api_servers[host] = bed.start(host, "api", argv, platform.host_env(host))
    for host in CONTROL_HOSTS:
        schedule = bed.root / "hosts" / host / "celerybeat-schedule"
        schedule.parent.mkdir(parents=True, exist_ok=True)
        beat = [str(Path(stack_py.BIN) / "celery"), "-A", "config", "beat", "--loglevel",
                "INFO", "--schedule", str(schedule)]  # fmt: skip
        bed.start(host, "beat", beat, platform.host_env(host))
        control = stack_py.control_worker(hostname=f"control@{host}")
        bed.start(host, "control", control, platform.host_env(host))
    for host in GPU_HOSTS:
        argv = stack_py.gpu_pool_worker(str(Path(stack_py.BIN) / "celery"), host, GPUS_PER_NODE)
        # Its own /metrics on the host's address: one Prometheus target per host.
        metrics = {
            "GANTRY_METRICS_ADDR": bed.hosts[host].address,
            "GANTRY_METRICS_PORT": str(METRICS_PORT),
        }
        bed.start(host, "worker", argv, platform.host_env(host, **metrics))

    for host, server in api_servers.items():
        server.wait_http_ok(API_PORT, "/readyz", host=bed.hosts[host].address, timeout=90)
    for host in GPU_HOSTS:
        wait_until(
            lambda host=host: f"{host}@{host} ready." in platform.log(host, "worker"),
            what=f"the worker of {host}",
            timeout=90,
            check=platform.check_alive,
            every=0.3,
        )
    platform.operator = GantryAPI(platform.api_url("api-1"), operator_key)
    org = platform.operator.request("POST", "/v1/orgs", body={"name": "multi", "tier": "paid"})
    platform.org_id = org.data["id"]
    project = platform.operator.request(
        "POST", f"/v1/orgs/{org.data['id']}/projects", body={"name": "hosts"}
    ).data
    platform.project_id = project["id"]
    key = platform.operator.request(
        "POST", "/v1/api-keys", body={"org": org.data["id"], "project": project["id"]}
    ).data
    platform.operator.request(
        "POST",
        "/v1/credits/grants",
        body={"org": org.data["id"], "amount": 10_000 * 1_000_000, "kind": "grant"},
        headers={"Idempotency-Key": "multihost-grant"},
    )
    platform.tenant = GantryAPI(platform.api_url("api-1"), key["key"])
    return platform


def leading_beat(platform: Platform) -> str:
    """The control host whose beat leads now (the last of its 'beat leads/follows' lines)."""
    leaders = [host for host in CONTROL_HOSTS if last_beat_state(platform, host) == "leads"]
    assert len(leaders) == 1, f"beats leading: {leaders}"
    return leaders[0]


def last_beat_state(platform: Platform, host: str) -> str:
    states = re.findall(r'"msg": "beat (leads|follows)', platform.log(host, "beat"))
    return states[-1] if states else ""


def log_records(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def wall_clock_of(record: dict) -> float:
    """A JSON log line's timestamp as unix time (every host shares this machine's clock)."""
    return datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
