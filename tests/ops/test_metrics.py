"""Metrics of every process, read the way Prometheus reads them: over HTTP, before and after.

The API is gunicorn with two worker processes, the dispatch tick runs in the prefork
control worker, the run in the GPU-pool worker (tests/ops/live_stack.py); each series must
move where the work happened, and the API's must add up over its processes. The shipped
Prometheus, Grafana and docker-compose files must agree with the code and each other.
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.parse
import urllib.request
import uuid

import yaml
from prometheus_client import REGISTRY

from apps.accounts.models import Tier
from apps.jobs.models import Attempt, Job, JobStatus
from tests.ops.live_stack import (
    NODE,
    gunicorn_workers,
    job_body,
    make_tenant,
    on_live_stack,
    terminal,
    value,
    wait_for,
)
from tests.worker_harness import ROOT

OPS = ROOT / "ops"


def moved(before, after):
    """moved(before, after)(name, **labels): how much a sample grew between two scrapes."""
    return lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)


@on_live_stack
def test_series_move_where_a_good_and_a_crashing_job_ran(ops):
    tenant = make_tenant(tier=Tier.PAID)
    before_api, before_control, before_node = (
        ops.scrape_api(),
        ops.scrape_control(),
        ops.scrape_node(),
    )
    status, good = ops.submit(
        tenant.key, job_body(tenant, prompt="a red fox in snow", steps=12, step_seconds=0.1)
    )
    assert status == 202, good
    status, crash = ops.submit(tenant.key, job_body(tenant, prompt="!crash at the ford"))
    assert status == 202, crash

    h100 = {"gpu_type": "H100", "node": NODE}
    seen = {"gantry_gpus_busy": 0.0, "gantry_running_jobs": 0.0}

    def watch_fleet():
        fleet = ops.scrape_control()
        for name, most in seen.items():
            seen[name] = max(most, value(fleet, name, **h100))

    ops.until(terminal(good["id"], crash["id"]), timeout=40, during=watch_fleet)
    assert Job.objects.get(pk=good["id"]).status == JobStatus.SUCCEEDED, ops.logs()
    failed = Job.objects.get(pk=crash["id"])
    assert (failed.status, failed.error_code, failed.attempt_count) == ("failed", "crashed", 3)
    ops.tick()  # one tick after the last finish: the fleet gauges show it idle again
    wait_for(
        lambda: value(ops.scrape_control(), "gantry_gpus_busy", **h100) == 0,
        what="GPUs idle after the jobs",
        timeout=10,
    )
    after_api, after_control, after_node = ops.scrape_api(), ops.scrape_control(), ops.scrape_node()

    # API (gunicorn, two processes): both holds were taken there.
    api = moved(before_api, after_api)
    assert api("gantry_ledger_operations_total", op="reserve", outcome="ok") == 2

    # Control worker: four placements (one good run, three crashing attempts) by the ticks.
    control = moved(before_control, after_control)
    assert control("gantry_dispatch_decisions_total", kind="place", outcome="applied") == 4
    assert control("gantry_dispatch_tick_seconds_count") >= 4
    assert seen["gantry_gpus_busy"] >= 1 and seen["gantry_running_jobs"] >= 1
    assert value(after_control, "gantry_gpus", **h100) == 2
    assert value(after_control, "gantry_running_jobs", **h100) == 0
    assert value(after_control, "gantry_queue_depth", tier="paid") == 0
    assert ("gantry_queue_oldest_seconds", frozenset({("tier", "paid")})) in after_control

    # GPU worker: starts, exits by class, the retry decisions, settlements, heartbeats.
    node = moved(before_node, after_node)
    assert node("gantry_start_wait_seconds_count", tier="paid") == 4
    assert node("gantry_runner_attempts_total", exit_class="succeeded") == 1
    assert node("gantry_runner_attempts_total", exit_class="crashed") == 3
    assert node("gantry_job_retries_total", exit_class="crashed") == 2
    assert node("gantry_job_failures_total", error_code="crashed") == 1
    assert node("gantry_ledger_operations_total", op="settle", outcome="ok") == 2
    assert node("gantry_heartbeat_lag_seconds_count", node=NODE) >= 3
    assert node("gantry_runner_gpu_seconds_total") > 0
    assert node("gantry_ledger_usage_reports_total", stage="recorded") >= 3


def serving_pids(stack, request_ids: list[str]) -> dict[str, int]:
    """{request id: pid of the gunicorn worker that served it}, from the JSON access log."""
    pids = {}
    for line in stack.api.log().splitlines():
        if line.startswith("{") and '"gantry.access"' in line:
            entry = json.loads(line)
            for request_id in request_ids:
                if f"request_id={request_id} " in entry["msg"]:
                    pids[request_id] = entry["pid"]
    return pids


@on_live_stack
def test_api_counts_add_up_over_gunicorn_processes_and_outlive_them(ops):
    """Each refusal is counted by the worker process that served it; the worker that
    served them is then stopped (gunicorn starts another) and its counts stay in the
    total, beside those of the processes that serve the next refusals."""
    tenant = make_tenant(tier=Tier.FREE, rate_per_s=0.001, rate_burst=1)
    before = ops.scrape_api()
    status, _ = ops.submit(tenant.key, job_body(tenant, prompt="the only token"))
    assert status == 202
    first = [f"refused-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for request_id in first:
        status, answer = ops.submit(
            tenant.key, job_body(tenant, prompt="too soon"), request_id=request_id
        )
        assert (status, answer["error"]["code"]) == (429, "rate_limited")
    wait_for(lambda: len(serving_pids(ops, first)) == 3, what="access lines", timeout=10)
    counted_by = serving_pids(ops, first)[first[-1]]
    assert counted_by in gunicorn_workers(ops.api.proc.pid)

    os.kill(counted_by, signal.SIGTERM)  # the master replaces it
    wait_for(
        lambda: counted_by not in gunicorn_workers(ops.api.proc.pid),
        what="the worker gone",
        timeout=30,
    )
    for _ in range(3):
        status, _ = ops.submit(tenant.key, job_body(tenant, prompt="still too soon"))
        assert status == 429
    after = ops.scrape_api()

    refused = {"name": "gantry_admission_refusals_total", "tier": "free", "reason": "rate_limited"}
    assert value(after, **refused) - value(before, **refused) == 6
    assert moved(before, after)("gantry_ledger_operations_total", op="reserve", outcome="ok") == 1
    ops.until(terminal(*Job.objects.filter(org=tenant.org).values_list("pk", flat=True)))


def flower_rows(ops, attempt_id: str) -> list[dict]:
    """The task table of Flower's Tasks page, searched for an attempt's id."""
    query = urllib.parse.urlencode(
        {
            "draw": 1,
            "start": 0,
            "length": 10,
            "search[value]": attempt_id,
            "order[0][column]": 0,
            "order[0][dir]": "desc",
            "columns[0][data]": "name",
        }
    )
    url = f"http://127.0.0.1:{ops.flower_port}/tasks/datatable?{query}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())["data"]


@on_live_stack
def test_flower_shows_each_run_by_task_name_queue_and_worker(ops):
    tenant = make_tenant(tier=Tier.ENTERPRISE)
    status, job = ops.submit(tenant.key, job_body(tenant, prompt="a heron at dawn"))
    assert status == 202
    ops.until(terminal(job["id"]))
    attempt_id = str(Attempt.objects.get(job_id=job["id"]).pk)

    def rows() -> list[dict]:
        return flower_rows(ops, attempt_id)

    # 30 s: under the whole suite on two cores, 15 s once passed without Flower showing
    # the run (2026-12-03; the cause was not found, its logs were gone).
    wait_for(lambda: any(row["state"] == "SUCCESS" for row in rows()), what="Flower", timeout=30)
    (run,) = rows()
    assert (run["name"], run["routing_key"], run["worker"]) == (
        "gantry.jobs.run_attempt",
        f"node.{NODE}",
        ops.gpu_worker.hostname,
    )
    assert attempt_id in run["args"]

    flower = ops.scrape_flower()
    runs = {"task": "gantry.jobs.run_attempt", "worker": ops.gpu_worker.hostname}
    assert value(flower, "flower_events_total", type="task-succeeded", **runs) >= 1
    # The launcher's buckets: runs last minutes, not the default's 10 s at most.
    hour_bucket = frozenset({*runs.items(), ("le", "3600.0")})
    assert ("flower_task_runtime_seconds_bucket", hour_bucket) in flower


# --------------------------------------------------------------------------- tick gauges


def test_tick_gauges_count_this_ticks_placements_and_zero_a_node_that_left():
    from apps.scheduler.policy import (
        ClusterSnapshot,
        Gpu,
        Node,
        Place,
        QueuedJob,
        RunningAllocation,
    )
    from apps.scheduler.services.metrics import report_tick

    big, small = f"n-{uuid.uuid4().hex[:6]}", f"n-{uuid.uuid4().hex[:6]}"
    nodes = [
        Node(big, [Gpu(1, 0, "H100", free=False), Gpu(2, 1, "H100"), Gpu(3, 2, "H100")]),
        Node(small, [Gpu(4, 0, "A100")]),
    ]
    running = [RunningAllocation("a1", "j1", big, (1,), "paid", "o", "u", 0.0, 60.0)]
    queued = [
        QueuedJob("j2", "free", "o", "u", submitted_at=400.0, gpu_count=2, max_runtime_s=60),
        QueuedJob("j3", "free", "o", "u", submitted_at=700.0, gpu_count=1, max_runtime_s=60),
    ]
    placed = [Place("j2", big, (2, 3), "H100", "fair share")]
    report_tick(ClusterSnapshot(1000.0, [], nodes, running, queued), placed)

    def gauge(name, **labels):
        return REGISTRY.get_sample_value(name, labels)

    assert gauge("gantry_gpus_busy", gpu_type="H100", node=big) == 3  # 1 running + 2 placed
    assert gauge("gantry_running_jobs", gpu_type="H100", node=big) == 2
    assert gauge("gantry_gpus", gpu_type="A100", node=small) == 1
    assert gauge("gantry_queue_oldest_seconds", tier="free") == 300  # j2 left the queue

    report_tick(ClusterSnapshot(1001.0, [], nodes[:1], [], []), [])  # `small` is gone
    assert gauge("gantry_gpus", gpu_type="A100", node=small) == 0
    assert gauge("gantry_gpus_busy", gpu_type="H100", node=big) == 1  # the snapshot's own
    assert gauge("gantry_queue_oldest_seconds", tier="free") == 0


# --------------------------------------------------------------------------- shipped config


def defined_series() -> dict[str, str]:
    """{sample name: family name} of every gantry_ series the code defines."""
    import apps.jobs.metrics
    import apps.jobs.services.runner
    import apps.ledger.metrics
    import apps.scheduler.services.metrics  # noqa: F401

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {
        family.name + suffix: family.name
        for family in REGISTRY.collect()
        if family.name.startswith("gantry_")
        for suffix in suffixes[family.type]
    }


def dashboard_panels() -> list[dict]:
    dashboard = json.loads((OPS / "grafana" / "dashboards" / "gantry.json").read_text())
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def test_dashboard_charts_every_named_series_and_only_series_that_exist():
    panels = dashboard_panels()
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bgantry_[a-z_]+", expr)}
    defined = defined_series()
    assert used - defined.keys() == set()
    charted = {defined[name] for name in used}
    assert {
        "gantry_queue_depth",
        "gantry_queue_oldest_seconds",
        "gantry_start_wait_seconds",
        "gantry_gpus_busy",
        "gantry_running_jobs",
        "gantry_dispatch_tick_seconds",
        "gantry_dispatch_decisions",
        "gantry_preempted_jobs",
        "gantry_runner_attempts",
        "gantry_job_retries",
        "gantry_job_failures",
        "gantry_ledger_operations",
        "gantry_ledger_reconcile_violations",
        "gantry_heartbeat_lag_seconds",
        "gantry_admission_refusals",
    } <= charted
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    datasource = yaml.safe_load(
        (OPS / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    assert {panel["datasource"]["uid"] for panel in panels} == {datasource["uid"]}


def test_every_series_is_documented():
    documented = (ROOT / "docs" / "operations.md").read_text()
    families = set(defined_series().values())
    assert {name for name in families if f"`{name}" not in documented} == set()


def test_prometheus_scrapes_every_process_of_the_compose_stack():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    scrape = yaml.safe_load((OPS / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: {t for group in job["static_configs"] for t in group["targets"]}
        for job in scrape["scrape_configs"]
    }
    services = compose["services"]
    workers = {
        f"{name}:{service['environment']['GANTRY_METRICS_PORT']}"
        for name, service in services.items()
        if "celery -A config worker" in str(service.get("command", ""))
    }
    assert len(workers) == 4  # the control worker and one per node of the demo fleet
    assert targets == {
        "gantry-api": {"api:8000"},
        "gantry-worker": workers,
        "flower": {"flower:5555"},
    }
    assert (
        "./ops/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
        in services["prometheus"]["volumes"]
    )
    assert {"./ops/grafana/provisioning:/etc/grafana/provisioning:ro"} <= set(
        services["grafana"]["volumes"]
    )


@on_live_stack
def test_flower_shows_a_crashed_attempt_as_failed_naming_its_job_and_org(ops):
    tenant = make_tenant(tier=Tier.ENTERPRISE)
    status, job = ops.submit(tenant.key, job_body(tenant, prompt="!crash on purpose", steps=3))
    assert status == 202
    ops.until(terminal(job["id"]), timeout=60)
    attempt_ids = [
        str(pk) for pk in Attempt.objects.filter(job_id=job["id"]).values_list("pk", flat=True)
    ]

    def rows(attempt_id: str) -> list[dict]:
        return flower_rows(ops, attempt_id)

    def failed_run() -> dict | None:
        return next((r for a in attempt_ids for r in rows(a) if r["state"] == "FAILURE"), None)

    # Any of the job's attempts: the first in the database's order once never showed
    # FAILURE within 15, 30 or 60 s under the whole suite (fresh-ci of 5c52bb6, 285bbf5,
    # b61bd1a), the same wait whatever its length.
    wait_for(lambda: failed_run() is not None, what="Flower", timeout=60)
    run = failed_run()
    assert job["id"] in run["kwargs"] and tenant.org.name in run["kwargs"]
    assert "crashed" in (run.get("exception") or "") + (run.get("result") or "")
    runs = {"task": "gantry.jobs.run_attempt", "worker": ops.gpu_worker.hostname}
    # The job ends in the database before its last task reports failing: wait for
    # Flower to count every attempt's event (an immediate read once saw 2 of 3).
    wait_for(
        lambda: (
            value(ops.scrape_flower(), "flower_events_total", type="task-failed", **runs)
            >= len(attempt_ids)
        ),
        what="Flower counting every attempt's task-failed event",
        timeout=30,
    )
