"""A fleet of more nodes than `make up` starts GPU-pool workers for on one host
(GANTRY_LOCAL_GPU_POOLS): the launcher starts that many workers, each serving several
nodes' queues, and every node is alive and runs jobs. A node added while the platform
runs gets a worker within seconds."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command
from django.db import connection

from apps.fleet.liveness import pulses
from apps.fleet.models import NodeState
from tests.fleet.factories import NodeFactory
from tests.ops.launched import (
    call,
    drop_scratch_database,
    funded_tenant_key,
    launched_platform,
    supervised_once_running,
)
from tests.ops.live_stack import stack_py

pytestmark = pytest.mark.e2e

DEMO_NODES = ("a100-1", "a100-2", "h100-1")


def test_a_fleet_of_thousands_of_nodes_gets_as_many_workers_as_the_limit_with_even_gpus():
    nodes = [(f"n{i:04d}", 8 if i % 3 else 4) for i in range(1213)]
    pools = stack_py.gpu_pools(nodes, limit=8)
    assert len(pools) == 8
    assert [name for pool in pools for name in pool.nodes] == [name for name, _ in nodes]
    total = sum(gpus for _name, gpus in nodes)
    assert all(abs(pool.slots - total / 8) <= 8 for pool in pools)
    argv = stack_py.gpu_pool_worker("celery", pools[0].nodes, pools[0].slots, hostname="p@%h")
    assert argv[argv.index("--queues") + 1].split(",") == [f"node.{n}" for n in pools[0].nodes]
    assert argv[argv.index("--concurrency") + 1] == str(pools[0].slots)


def test_up_to_the_limit_each_node_has_its_own_worker_and_every_pool_gets_a_node():
    nodes = [("a", 4), ("b", 2), ("c", 2)]
    assert [p.name for p in stack_py.gpu_pools(nodes, limit=3)] == [
        "worker-a",
        "worker-b",
        "worker-c",
    ]
    # Nine one-GPU nodes in eight pools: none empty, whatever the shares say.
    pools = stack_py.gpu_pools([(f"n{i}", 1) for i in range(9)], limit=8)
    assert len(pools) == 8 and all(pool.nodes for pool in pools)


def test_more_nodes_than_pools_under_make_up_are_all_alive_and_run_jobs(tmp_path):
    with launched_platform(tmp_path, extra_env={"GANTRY_LOCAL_GPU_POOLS": "2"}) as platform:
        api, operator = platform.api, platform.operator_key
        expected = {"worker-control", "worker-pool-1", "worker-pool-2"}
        workers = {name for name in supervised_once_running(expected) if name.startswith("worker-")}
        assert workers == expected
        deadline = time.monotonic() + 30
        while set(pulses(list(DEMO_NODES))) != set(DEMO_NODES):
            assert time.monotonic() < deadline, pulses(list(DEMO_NODES))
            time.sleep(0.5)

        tenant = funded_tenant_key(platform)
        # One job for each node: H100 (h100-1), 4 A100s (a100-1), 2 A100s (a100-2, best fit).
        shapes = [("H100", 1), ("A100", 4), ("A100", 2)]
        job_ids = []
        for gpu_type, count in shapes:
            body = {
                "project": "video",
                "params": {"prompt": f"{count} {gpu_type}", "steps": 12, "step_seconds": 0.25},
                "resources": {"gpu_count": count, "gpu_types": [gpu_type]},
                "max_runtime_s": 300,
            }
            status, job = call(f"{api}/v1/jobs", key=tenant, body=body)
            assert status == 202, job
            job_ids.append(job["id"])
        ran_on: dict[str, set[str]] = {}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for node in DEMO_NODES:
                listed = call(f"{api}/v1/fleet/nodes/{node}", key=operator)[1]
                for gpu in listed.get("gpus", []):
                    if gpu["job"]:
                        ran_on.setdefault(gpu["job"], set()).add(node)
            statuses = [call(f"{api}/v1/jobs/{j}", key=tenant)[1]["status"] for j in job_ids]
            if all(s == "succeeded" for s in statuses):
                break
            time.sleep(0.3)
        assert statuses == ["succeeded"] * 3
        assert {node for nodes in ran_on.values() for node in nodes} == set(DEMO_NODES)
    drop_scratch_database()


def test_nodes_added_later_get_a_worker_each_then_one_for_a_batch_past_the_limit():
    table = {
        "worker-control": stack_py.Process(["celery", "--queues", "control"]),
        "worker-a": stack_py.Process(["celery", "--queues", "node.a"], nodes=("a",)),
    }
    nodes = [("a", 4), ("b", 2), ("c", 1), ("empty", 0)]
    added = stack_py.pools_for_new_nodes(table, nodes, limit=3)
    assert [(p.name, p.nodes, p.slots) for p in added] == [
        ("worker-b", ("b",), 2),
        ("worker-c", ("c",), 1),
    ]
    for pool in added:
        table[pool.name] = stack_py.pool_process(pool, port=0)
    assert stack_py.pools_for_new_nodes(table, nodes, limit=3) == []  # all served
    [batch] = stack_py.pools_for_new_nodes(table, [*nodes, ("d", 8), ("e", 8)], limit=3)
    assert (batch.name, batch.nodes, batch.slots) == ("worker-added-1", ("d", "e"), 16)


def test_a_node_named_like_the_control_worker_gets_a_pool_of_its_own_beside_it(monkeypatch):
    # A node `control` once took the name `worker-control` and replaced the control
    # worker in the process table: the platform ran without dispatch ticks.
    monkeypatch.setattr(stack_py, "node_queues", lambda env: [("control", 1), ("a100-1", 4)])
    processes = stack_py.platform_processes(
        {"DATABASE_URL": "postgres:///unused"}, api_port=0, flower_port=0, metrics_port_base=0
    )
    control = processes["worker-control"].argv
    assert control[control.index("--queues") + 1] == "control"
    assert control[control.index("--hostname") + 1] == "control@%h"
    node = processes["worker-control-2"]
    assert node.nodes == ("control",)
    assert node.argv[node.argv.index("--queues") + 1] == "node.control"
    assert node.argv[node.argv.index("--hostname") + 1] == "control-2@%h"
    assert processes["worker-a100-1"].nodes == ("a100-1",)
    hostnames = [
        p.argv[p.argv.index("--hostname") + 1] for p in processes.values() if "--hostname" in p.argv
    ]
    assert len(hostnames) == len(set(hostnames)) == 3


def test_a_node_added_later_under_a_taken_name_gets_the_next_free_one():
    table = {
        "worker-control": stack_py.Process(["celery", "--queues", "control"]),
        "worker-added-1": stack_py.Process(["celery", "--queues", "node.x"], nodes=("x",)),
    }
    [control] = stack_py.pools_for_new_nodes(table, [("x", 1), ("control", 2)], limit=8)
    assert (control.name, control.hostname, control.nodes) == (
        "worker-control-2",
        "control-2@%h",
        ("control",),
    )
    # Past the limit, the first batch would be `worker-added-2` after one pool counted
    # as added; a node named `added-2` has that name already.
    table = {
        "worker-control": stack_py.Process(["celery", "--queues", "control"]),
        "worker-added-2": stack_py.Process(["celery"], nodes=("added-2",)),
    }
    [batch] = stack_py.pools_for_new_nodes(table, [("y", 1), ("z", 1)], limit=2)
    assert (batch.name, batch.hostname, batch.nodes) == (
        "worker-added-2-2",
        "added-2-2@%h",
        ("y", "z"),
    )


@pytest.mark.django_db
def test_the_launchers_fleet_query_reads_what_manage_py_fleet_nodes_prints():
    NodeFactory(name="zeta", gpus=2)
    NodeFactory(name="alpha", gpus=1, gpus__type="A100")
    NodeFactory(name="gone", gpus=1, state=NodeState.DOWN)
    printed = io.StringIO()
    call_command("fleet_nodes", stdout=printed)
    with connection.cursor() as cursor:
        cursor.execute(stack_py.FLEET_NODES_SQL)
        read = [f"{name} {gpus}" for name, gpus in cursor.fetchall()]
    assert read == printed.getvalue().splitlines() == ["alpha 1", "zeta 2"]


def test_a_node_added_through_the_api_while_the_platform_runs_gets_a_worker_and_runs_a_job(
    tmp_path,
):
    with launched_platform(tmp_path) as platform:
        api, operator = platform.api, platform.operator_key
        price = {"memory_gb": 16, "price_per_gpu_hour": 500_000}
        t4 = f"{api}/v1/fleet/gpu-types/T4"
        assert call(t4, key=operator, body=price, method="PUT")[0] == 201
        node = {"name": "t4-late", "gpus": [{"type": "T4"}, {"type": "T4"}]}
        assert call(f"{api}/v1/fleet/nodes", key=operator, body=node)[0] == 201

        tenant = funded_tenant_key(platform)
        body = {
            "project": "video",
            "params": {"prompt": "only a T4 will do", "steps": 8, "step_seconds": 0.25},
            "resources": {"gpu_count": 2, "gpu_types": ["T4"]},
            "max_runtime_s": 300,
        }
        status, job = call(f"{api}/v1/jobs", key=tenant, body=body)
        assert status == 202, job
        deadline = time.monotonic() + 60
        while call(f"{api}/v1/jobs/{job['id']}", key=tenant)[1]["status"] != "succeeded":
            assert time.monotonic() < deadline, call(f"{api}/v1/jobs/{job['id']}", key=tenant)
            time.sleep(0.5)
        assert "worker-t4-late" in supervised_once_running({"worker-t4-late"})
        assert "new node(s) t4-late: starting worker-t4-late" in platform.log_path.read_text()
    drop_scratch_database()
