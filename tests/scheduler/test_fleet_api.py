"""The operator's fleet API: list, add, drain, undrain, remove nodes; GPU types."""

import pytest

from apps.fleet.models import Gpu, Node, NodeState
from apps.jobs.models import AttemptState
from apps.scheduler.services.dispatch import run_dispatch_tick
from apps.scheduler.services.recovery import requeue_attempt
from tests.scheduler.factories import (
    A100_PRICE,
    H100_PRICE,
    JobFactory,
    NodeFactory,
    gpu_types,
    live_attempt,
    unique_name,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _types(db):
    gpu_types()


ENDPOINTS = [
    ("get", "/v1/fleet/nodes"),
    ("post", "/v1/fleet/nodes"),
    ("get", "/v1/fleet/nodes/some-node"),
    ("post", "/v1/fleet/nodes/some-node/drain"),
    ("post", "/v1/fleet/nodes/some-node/undrain"),
    ("delete", "/v1/fleet/nodes/some-node"),
    ("get", "/v1/fleet/gpu-types"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_org_keys_are_refused_every_fleet_endpoint(tenant, method, path):
    NodeFactory(name="some-node")

    response = getattr(tenant, method)(path, {"name": "x", "gpus": [{"type": "H100"}]}, "json")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    assert Node.objects.get(name="some-node").state == NodeState.ACTIVE


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_without_a_key_the_fleet_is_401(anonymous, method, path):
    assert getattr(anonymous, method)(path).status_code == 401


def test_list_shows_each_gpu_and_the_job_running_on_it(operator):
    busy = NodeFactory(name=unique_name("a"), gpus=2)
    idle = NodeFactory(name=unique_name("b"), gpus=1, gpus__type="A100")
    job = JobFactory(gpu_count=1)
    run_dispatch_tick()
    attempt = live_attempt(job)

    response = operator.get("/v1/fleet/nodes")

    assert response.status_code == 200
    body = response.json()
    assert body["next"] is None
    by_name = {node["name"]: node for node in body["results"]}
    listed = by_name[busy.name]
    assert listed["state"] == "active" and listed["queue"] == f"node.{busy.name}"
    assert (listed["gpu_count"], listed["free_gpus"]) == (2, 1)
    held = [gpu for gpu in listed["gpus"] if gpu["job"]]
    assert held == [
        {
            "index": attempt.gpu_indices[0],
            "type": "H100",
            "device": f"GPU-{busy.name}-{attempt.gpu_indices[0]}",
            "attempt": str(attempt.pk),
            "job": str(job.pk),
            "job_status": "scheduled",
        }
    ]
    assert by_name[idle.name]["gpus"][0]["type"] == "A100"
    assert by_name[idle.name]["free_gpus"] == 1


def test_list_filters_by_state_and_paginates(operator):
    for _ in range(3):
        NodeFactory()
    drained = NodeFactory(state=NodeState.DRAINING)

    only_draining = operator.get("/v1/fleet/nodes?state=draining").json()["results"]
    first_page = operator.get("/v1/fleet/nodes?limit=2").json()
    second_page = operator.get("/v1/fleet/nodes", {"limit": 2, "cursor": first_page["next"]}).json()

    assert [n["name"] for n in only_draining] == [drained.name]
    assert len(first_page["results"]) == 2 and len(second_page["results"]) == 2
    names = [n["name"] for n in first_page["results"] + second_page["results"]]
    assert names == sorted(names) and len(set(names)) == 4


def test_list_with_an_unknown_state_is_400(operator):
    response = operator.get("/v1/fleet/nodes?state=sleepy")

    assert response.status_code == 400
    assert response.json()["error"]["field"] == "state"


def test_add_a_node_with_its_gpus(operator):
    name = unique_name("new")

    response = operator.post(
        "/v1/fleet/nodes",
        {"name": name, "gpus": [{"type": "H100"}, {"type": "H100", "device": "GPU-abc"}]},
        format="json",
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == name and body["state"] == "active" and body["gpu_count"] == 2
    assert [g["device"] for g in body["gpus"]] == ["0", "GPU-abc"]
    assert list(Gpu.objects.filter(node__name=name).values_list("index", "gpu_type")) == [
        (0, "H100"),
        (1, "H100"),
    ]


def test_the_new_node_gets_work_at_the_next_tick(operator):
    job = JobFactory(gpu_types=["A100"])
    name = unique_name("fresh")
    operator.post("/v1/fleet/nodes", {"name": name, "gpus": [{"type": "A100"}]}, format="json")

    run_dispatch_tick()

    assert live_attempt(job).node.name == name


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "n1", "gpus": [{"type": "H100"}, {"type": "TPU9"}]}, "gpus[1].type"),
        ({"name": "n1", "gpus": [{"kind": "H100"}]}, "gpus[0].type"),
        ({"name": "n1", "gpus": [{"type": "H100", "colour": "red"}]}, "gpus[0]"),
        ({"name": "n1", "gpus": []}, "gpus"),
        ({"name": "n1"}, "gpus"),
        ({"name": "bad name/../x", "gpus": [{"type": "H100"}]}, "name"),
        ({"name": "-leading-dash", "gpus": [{"type": "H100"}]}, "name"),
        ({"gpus": [{"type": "H100"}]}, "name"),
        ({"name": "n1", "gpus": [{"type": "H100"}] * 65}, "gpus"),
    ],
)
def test_bad_node_bodies_are_400_naming_the_field(operator, body, field):
    response = operator.post("/v1/fleet/nodes", body, format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["error"]["field"] == field
    assert not Node.objects.filter(name="n1").exists()


def test_adding_an_existing_name_is_409(operator):
    node = NodeFactory()

    response = operator.post(
        "/v1/fleet/nodes", {"name": node.name, "gpus": [{"type": "H100"}]}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["error"]["field"] == "name"
    assert Gpu.objects.filter(node=node).count() == 1


def test_get_one_node_and_404_for_unknown(operator):
    node = NodeFactory(gpus=3)

    assert operator.get(f"/v1/fleet/nodes/{node.name}").json()["gpu_count"] == 3
    assert operator.get("/v1/fleet/nodes/nope").status_code == 404


def test_drain_then_undrain(operator):
    node = NodeFactory()

    drained = operator.post(f"/v1/fleet/nodes/{node.name}/drain")
    again = operator.post(f"/v1/fleet/nodes/{node.name}/drain")

    assert drained.status_code == again.status_code == 200
    assert drained.json()["state"] == "draining"
    assert Node.objects.get(pk=node.pk).state == NodeState.DRAINING
    undrained = operator.post(f"/v1/fleet/nodes/{node.name}/undrain")
    assert undrained.status_code == 200 and undrained.json()["state"] == "active"


@pytest.mark.parametrize("action", ["drain", "undrain"])
def test_draining_an_unknown_node_is_404(operator, action):
    response = operator.post(f"/v1/fleet/nodes/ghost/{action}")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_draining_node_keeps_running_its_jobs(operator):
    node = NodeFactory(gpus=2)
    job = JobFactory()
    run_dispatch_tick()

    operator.post(f"/v1/fleet/nodes/{node.name}/drain")

    listed = operator.get(f"/v1/fleet/nodes/{node.name}").json()
    assert listed["state"] == "draining"
    assert [g["job"] for g in listed["gpus"] if g["job"]] == [str(job.pk)]
    assert live_attempt(job).state == AttemptState.SCHEDULED


def test_removing_a_busy_node_is_409_telling_to_drain_first(operator):
    node = NodeFactory()
    JobFactory()
    run_dispatch_tick()

    response = operator.delete(f"/v1/fleet/nodes/{node.name}")

    assert response.status_code == 409
    assert "drain" in response.json()["error"]["message"]
    assert Node.objects.get(pk=node.pk).state == NodeState.ACTIVE


def test_removing_a_node_that_ran_jobs_keeps_it_down_with_its_history(operator):
    node = NodeFactory()
    job = JobFactory()
    run_dispatch_tick()
    attempt = live_attempt(job)
    operator.post(f"/v1/fleet/nodes/{node.name}/drain")
    requeue_attempt(attempt_id=attempt.pk, reason="node retired", actor="test")

    response = operator.delete(f"/v1/fleet/nodes/{node.name}")

    assert response.status_code == 204
    node.refresh_from_db()
    assert node.state == NodeState.DOWN
    attempt.refresh_from_db()
    assert attempt.node_id == node.pk  # the attempt's history still names its node
    assert operator.get("/v1/fleet/nodes?state=down").json()["results"][0]["name"] == node.name
    # A removed node gets no work, and drain needs it back first.
    run_dispatch_tick()
    assert live_attempt(job) is None
    assert operator.post(f"/v1/fleet/nodes/{node.name}/drain").status_code == 409
    assert operator.post(f"/v1/fleet/nodes/{node.name}/undrain").json()["state"] == "active"


def test_removing_a_node_that_never_ran_anything_deletes_it(operator):
    node = NodeFactory(gpus=2)

    response = operator.delete(f"/v1/fleet/nodes/{node.name}")

    assert response.status_code == 204
    assert not Node.objects.filter(pk=node.pk).exists()
    assert not Gpu.objects.filter(node_id=node.pk).exists()
    assert operator.delete(f"/v1/fleet/nodes/{node.name}").status_code == 404


def test_gpu_types_with_prices_and_counts(operator):
    NodeFactory(gpus=2)
    NodeFactory(gpus=3, gpus__type="A100")
    NodeFactory(gpus=8, state=NodeState.DOWN)  # removed: not in the fleet
    JobFactory(gpu_types=["A100"])
    run_dispatch_tick()

    response = operator.get("/v1/fleet/gpu-types")

    assert response.status_code == 200
    assert response.json()["results"] == [
        {
            "name": "H100",
            "memory_gb": 80,
            "price_per_gpu_hour": H100_PRICE,
            "gpu_count": 2,
            "free_gpus": 2,
        },
        {
            "name": "A100",
            "memory_gb": 40,
            "price_per_gpu_hour": A100_PRICE,
            "gpu_count": 3,
            "free_gpus": 2,
        },
    ]
