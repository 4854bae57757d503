"""load_fleet and fleet_nodes, as the launcher uses them; and the admin's node actions."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User as DjangoUser
from django.core.management import CommandError, call_command

from apps.fleet.models import Gpu, GpuType, Node, NodeState
from apps.scheduler.services.dispatch import run_dispatch_tick
from tests.scheduler.factories import JobFactory, NodeFactory, unique_name

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_load_fleet_from_a_file_is_idempotent_and_fleet_nodes_lists_pools(tmp_path):
    name = unique_name("file")
    fleet = tmp_path / "fleet.json"
    fleet.write_text(
        json.dumps(
            {
                "gpu_types": {"L4": {"memory_gb": 24, "price_per_gpu_hour": 700_000}},
                "nodes": [{"name": name, "gpus": [{"type": "L4"}, {"type": "L4"}]}],
            }
        )
    )

    first = run("load_fleet", "--file", str(fleet))
    run("load_fleet", "--file", str(fleet))

    assert "1 nodes, 2 GPUs" in first
    assert GpuType.objects.get(name="L4").price_per_gpu_hour == 700_000
    assert Gpu.objects.filter(node__name=name).count() == 2
    down = NodeFactory(state=NodeState.DOWN)
    listed = run("fleet_nodes").splitlines()
    assert f"{name} 2" in listed
    assert not any(line.startswith(f"{down.name} ") for line in listed)


def test_load_fleet_refuses_a_bad_file_naming_the_problem(tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps({"gpu_types": {}, "nodes": []}))

    with pytest.raises(CommandError, match="gpu_types"):
        run("load_fleet", "--file", str(fleet))


def test_the_demo_fleet_loads_without_a_file(settings):
    settings.GANTRY_FLEET_FILE = ""

    assert "demo fleet" in run("load_fleet")
    assert set(GpuType.objects.values_list("name", flat=True)) >= {"H100", "A100"}


@pytest.fixture
def admin_client_(client):
    user = DjangoUser.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    return client


def test_admin_drains_and_undrains_nodes_with_actions(admin_client_):
    nodes = [NodeFactory(), NodeFactory()]
    url = "/admin/fleet/node/"
    ids = [str(n.pk) for n in nodes]

    admin_client_.post(url, {"action": "drain", "_selected_action": ids})

    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.DRAINING}
    admin_client_.post(url, {"action": "undrain", "_selected_action": ids[:1]})
    assert Node.objects.get(pk=nodes[0].pk).state == NodeState.ACTIVE
    assert Node.objects.get(pk=nodes[1].pk).state == NodeState.DRAINING
    listing = admin_client_.get(url + "?state__exact=draining")
    assert listing.status_code == 200 and nodes[1].name in listing.content.decode()


def test_admin_refuses_to_remove_a_busy_node_and_says_why(admin_client_):
    node = NodeFactory()
    JobFactory()
    run_dispatch_tick()

    response = admin_client_.post(
        "/admin/fleet/node/",
        {"action": "remove", "_selected_action": [str(node.pk)]},
        follow=True,
    )

    assert "drain it first" in response.content.decode()
    assert Node.objects.get(pk=node.pk).state == NodeState.ACTIVE


def test_admin_pages_of_the_scheduler_render(admin_client_):
    node = NodeFactory(gpus=2)
    JobFactory()
    run_dispatch_tick()

    for url in [
        "/admin/fleet/gputype/",
        "/admin/fleet/node/",
        f"/admin/fleet/node/{node.pk}/change/",
        "/admin/scheduler/dispatchdecision/",
        "/admin/scheduler/nodeclaim/",
        "/admin/scheduler/usageaccount/",
    ]:
        assert admin_client_.get(url).status_code == 200, url
