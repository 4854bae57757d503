"""A fleet of more nodes than `make up` starts GPU-pool workers for on one host
(GANTRY_LOCAL_GPU_POOLS): the launcher starts that many workers, each serving several
nodes' queues, and every node is alive and runs jobs."""

from __future__ import annotations

import time

import pytest

from apps.fleet.liveness import pulses
from tests.ops.launched import call, drop_scratch_database, launched_platform, supervised_pids
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
        workers = {name for name in supervised_pids() if name.startswith("worker-")}
        assert workers == {"worker-control", "worker-pool-1", "worker-pool-2"}
        deadline = time.monotonic() + 30
        while set(pulses(list(DEMO_NODES))) != set(DEMO_NODES):
            assert time.monotonic() < deadline, pulses(list(DEMO_NODES))
            time.sleep(0.5)

        status, org = call(f"{api}/v1/orgs", key=operator, body={"name": "acme", "tier": "paid"})
        assert status == 201, org
        call(f"{api}/v1/orgs/{org['id']}/projects", key=operator, body={"name": "video"})
        grant = {"org": org["id"], "amount": 500_000_000, "kind": "paid"}
        assert call(f"{api}/v1/credits/grants", key=operator, body=grant)[0] == 201
        tenant = call(f"{api}/v1/api-keys", key=operator, body={"org": org["id"]})[1]["key"]
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
