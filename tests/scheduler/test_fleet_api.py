"""The operator's fleet API: list, add, drain, undrain, remove nodes; GPU types and
their prices."""

import pytest

from apps.accounts.models import APIKey, OperatorAction
from apps.fleet import operations as fleet_operations
from apps.fleet.models import Gpu, GpuType, Node, NodeState
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
    ("put", "/v1/fleet/gpu-types/H100"),
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


# Prices: PUT /v1/fleet/gpu-types/{name}, and the admin's GPU type page, both through
# apps.fleet.operations.set_gpu_type.


def _operator_prefix() -> str:
    return APIKey.objects.get(is_operator=True).prefix


def test_an_operator_changes_a_price_recorded_with_before_and_after(operator):
    response = operator.put("/v1/fleet/gpu-types/H100", {"price_per_gpu_hour": 4_500_000}, "json")

    assert response.status_code == 200, response.json()
    assert response.json() == {
        "name": "H100",
        "memory_gb": 80,
        "price_per_gpu_hour": 4_500_000,
        "gpu_count": 0,
        "free_gpus": 0,
    }
    assert GpuType.objects.get(pk="H100").price_per_gpu_hour == 4_500_000
    [row] = OperatorAction.objects.filter(action="gpu_type.update")
    assert row.actor == f"api:{_operator_prefix()}"
    assert (row.target_type, row.target_id) == ("gpu_type", "H100")
    assert row.before == {"memory_gb": 80, "price_per_gpu_hour": H100_PRICE}
    assert row.after == {"memory_gb": 80, "price_per_gpu_hour": 4_500_000}


def test_a_new_price_applies_to_placements_from_now_on(operator):
    NodeFactory(gpus=2)
    placed_before = JobFactory()
    run_dispatch_tick()

    operator.put("/v1/fleet/gpu-types/H100", {"price_per_gpu_hour": 5_000_000}, "json")
    placed_after = JobFactory()
    run_dispatch_tick()

    assert live_attempt(placed_before).price_per_gpu_hour == H100_PRICE
    assert live_attempt(placed_after).price_per_gpu_hour == 5_000_000


def test_setting_the_price_a_type_has_already_answers_200_and_records_nothing(operator):
    body = {"memory_gb": 80, "price_per_gpu_hour": H100_PRICE}

    response = operator.put("/v1/fleet/gpu-types/H100", body, "json")

    assert response.status_code == 200
    assert not OperatorAction.objects.filter(action="gpu_type.update").exists()


def test_an_operator_adds_a_gpu_type_with_its_memory(operator):
    response = operator.put(
        "/v1/fleet/gpu-types/L40S", {"memory_gb": 48, "price_per_gpu_hour": 1_800_000}, "json"
    )

    assert response.status_code == 201, response.json()
    assert response.json()["name"] == "L40S" and response.json()["memory_gb"] == 48
    assert GpuType.objects.get(pk="L40S").price_per_gpu_hour == 1_800_000
    [row] = OperatorAction.objects.filter(action="gpu_type.update", target_id="L40S")
    assert row.before == {} and row.after == {"memory_gb": 48, "price_per_gpu_hour": 1_800_000}
    # Nodes can have its GPUs at once.
    added = operator.post(
        "/v1/fleet/nodes", {"name": unique_name("l40s"), "gpus": [{"type": "L40S"}]}, "json"
    )
    assert added.status_code == 201


def test_a_new_gpu_type_without_its_memory_is_400_and_not_created(operator):
    response = operator.put("/v1/fleet/gpu-types/L40S", {"price_per_gpu_hour": 1}, "json")

    assert response.status_code == 400
    assert response.json()["error"]["field"] == "memory_gb"
    assert not GpuType.objects.filter(pk="L40S").exists()


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("H100", {"price_per_gpu_hour": -1}, "price_per_gpu_hour"),
        ("H100", {"price_per_gpu_hour": 2**70}, "price_per_gpu_hour"),
        ("H100", {"price_per_gpu_hour": 2**63 - 1}, "price_per_gpu_hour"),
        ("H100", {"price_per_gpu_hour": "4500000"}, "price_per_gpu_hour"),
        ("H100", {"price_per_gpu_hour": 4.5}, "price_per_gpu_hour"),
        ("H100", {"price_per_gpu_hour": True}, "price_per_gpu_hour"),
        ("H100", {"price_per_gpu_hour": None}, "price_per_gpu_hour"),
        ("H100", {}, "price_per_gpu_hour"),
        ("H100", {"memory_gb": 0, "price_per_gpu_hour": 1}, "memory_gb"),
        ("H100", {"memory_gb": 2**70, "price_per_gpu_hour": 1}, "memory_gb"),
        ("H100", {"memory_gb": "80", "price_per_gpu_hour": 1}, "memory_gb"),
        ("X" * 33, {"memory_gb": 8, "price_per_gpu_hour": 1}, "name"),
        ("-dash", {"memory_gb": 8, "price_per_gpu_hour": 1}, "name"),
        ("a%20b", {"memory_gb": 8, "price_per_gpu_hour": 1}, "name"),
        ("a%0A", {"memory_gb": 8, "price_per_gpu_hour": 1}, "name"),
        ("H100%0A", {"memory_gb": 8, "price_per_gpu_hour": 1}, "name"),
    ],
)
def test_bad_gpu_types_are_400_naming_the_field_and_change_nothing(operator, name, body, field):
    response = operator.put(f"/v1/fleet/gpu-types/{name}", body, "json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert GpuType.objects.get(pk="H100").price_per_gpu_hour == H100_PRICE
    assert set(GpuType.objects.values_list("name", flat=True)) == {"H100", "A100"}
    assert not OperatorAction.objects.exists()


def test_a_type_from_the_fleet_file_keeps_its_name_and_its_price_can_change(operator):
    GpuType.objects.create(name="RTX 4090", memory_gb=24, price_per_gpu_hour=900_000)

    response = operator.put("/v1/fleet/gpu-types/RTX%204090", {"price_per_gpu_hour": 1}, "json")

    assert response.status_code == 200, response.content
    assert GpuType.objects.get(pk="RTX 4090").price_per_gpu_hour == 1


def test_a_body_that_is_not_a_json_object_is_400(operator):
    response = operator.put("/v1/fleet/gpu-types/H100", [1, 2], "json")

    assert response.status_code == 400
    assert GpuType.objects.get(pk="H100").price_per_gpu_hour == H100_PRICE


def test_an_org_key_cannot_change_a_price(tenant):
    response = tenant.put("/v1/fleet/gpu-types/H100", {"price_per_gpu_hour": 1}, "json")

    assert response.status_code == 403
    assert GpuType.objects.get(pk="H100").price_per_gpu_hour == H100_PRICE
    assert not OperatorAction.objects.exists()


def test_the_admins_price_change_goes_through_the_same_operation(admin_client, monkeypatch):
    calls = []
    original = fleet_operations.set_gpu_type

    def spy(**kwargs):
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(fleet_operations, "set_gpu_type", spy)

    response = admin_client.post(
        "/admin/fleet/gputype/H100/change/", {"memory_gb": 80, "price_per_gpu_hour": 4_200_000}
    )

    assert response.status_code == 302
    assert calls == [
        {
            "actor": "operator:admin",
            "name": "H100",
            "memory_gb": 80,
            "price_per_gpu_hour": 4_200_000,
        }
    ]
    [row] = OperatorAction.objects.filter(action="gpu_type.update")
    assert row.actor == "operator:admin"
    assert row.before == {"memory_gb": 80, "price_per_gpu_hour": H100_PRICE}
    assert row.after == {"memory_gb": 80, "price_per_gpu_hour": 4_200_000}


def test_the_admin_adds_a_gpu_type_and_refuses_a_price_the_fleet_cannot_hold(admin_client):
    added = admin_client.post(
        "/admin/fleet/gputype/add/", {"name": "L4", "memory_gb": 24, "price_per_gpu_hour": 700_000}
    )
    refused = admin_client.post(
        "/admin/fleet/gputype/H100/change/", {"memory_gb": 80, "price_per_gpu_hour": 2**62}
    )

    assert added.status_code == 302
    assert GpuType.objects.get(pk="L4").memory_gb == 24
    [row] = OperatorAction.objects.filter(action="gpu_type.update")
    assert (row.target_id, row.before, row.actor) == ("L4", {}, "operator:admin")
    assert refused.status_code == 200  # the form again, with the error
    assert "price_per_gpu_hour" in refused.context["adminform"].form.errors
    assert GpuType.objects.get(pk="H100").price_per_gpu_hour == H100_PRICE
