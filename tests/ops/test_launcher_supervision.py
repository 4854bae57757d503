"""The launcher supervises: a GPU worker or beat killed under `make up` is back within
seconds, the API answers throughout, and every job still ends with its hold settled
exactly (the ledger's reconciler finds nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.ops.launched import PYTHON, call, supervised_once_running, supervised_pids
from tests.worker_harness import ROOT

pytestmark = pytest.mark.e2e


def test_a_killed_gpu_worker_and_beat_come_back_and_every_job_settles_exactly(platform):
    api, operator, log_path = platform.api, platform.operator_key, platform.log_path
    status, org = call(f"{api}/v1/orgs", key=operator, body={"name": "acme", "tier": "paid"})
    assert status == 201, org
    call(f"{api}/v1/orgs/{org['id']}/projects", key=operator, body={"name": "video"})
    grant = {"org": org["id"], "amount": 500_000_000, "kind": "paid"}
    assert call(f"{api}/v1/credits/grants", key=operator, body=grant)[0] == 201
    status, issued = call(f"{api}/v1/api-keys", key=operator, body={"org": org["id"]})
    assert status == 201, issued
    tenant = issued["key"]

    answered, failures, stop = [], [], threading.Event()

    def probe():  # the API answers throughout
        while not stop.is_set():
            code = call(f"{api}/readyz", timeout=5)[0]
            (answered if code == 200 else failures).append(code)
            time.sleep(0.2)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    job_ids = []
    for i in range(6):
        body = {
            "project": "video",
            "params": {"prompt": f"fox {i}", "steps": 16, "step_seconds": 0.25},
            "resources": {"gpu_count": 1, "gpu_types": ["H100"]},
            "max_runtime_s": 300,
            "preemptible": True,
        }
        status, job = call(f"{api}/v1/jobs", key=tenant, body=body)
        assert status == 202, job
        job_ids.append(job["id"])
    time.sleep(3)  # some are running on h100-1 now
    before = supervised_once_running({"worker-h100-1", "beat"})
    killed_at = time.monotonic()
    for name in ("worker-h100-1", "beat"):
        os.kill(before[name], signal.SIGKILL)
    back = {}
    while len(back) < 2 and time.monotonic() - killed_at < 20:
        now = supervised_pids()
        for name in ("worker-h100-1", "beat"):
            if name not in back and now.get(name) not in (None, before[name]):
                back[name] = time.monotonic() - killed_at
        time.sleep(0.2)
    assert set(back) == {"worker-h100-1", "beat"}, log_path.read_text()[-3000:]
    assert max(back.values()) <= 10, back

    deadline = time.monotonic() + 120
    bodies = {}
    while time.monotonic() < deadline:
        bodies = {j: call(f"{api}/v1/jobs/{j}", key=tenant)[1] for j in job_ids}
        if all(
            b["status"] in ("succeeded", "failed", "cancelled", "timed_out")
            for b in bodies.values()
        ):
            break
        time.sleep(1)
    stop.set()
    prober.join(timeout=10)
    assert [b["status"] for b in bodies.values()] == ["succeeded"] * len(job_ids), bodies
    for body in bodies.values():
        hold = body["hold"]
        assert hold["state"] == "settled"
        assert hold["charged"] + hold["refunded"] == hold["amount"]
    assert failures == [] and len(answered) > 10
    reconcile = platform.manage("reconcile_ledger")
    assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr
    print(f"back after SIGKILL: {', '.join(f'{n} {s:.1f} s' for n, s in back.items())}")


def children_of(pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(pid).children()}


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped by whatever adopted it."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_api_master_takes_its_workers_with_it_and_a_new_one_serves(platform):
    """Before: uvicorn's workers outlived a master killed with SIGKILL, serving the old
    socket unsupervised, and the new master failed to bind the port every few seconds
    for as long as they lived (11 minutes under `make up`, and counting)."""
    master = supervised_once_running({"api"})["api"]
    workers = children_of(master)
    assert workers, "the API master has no workers"
    os.kill(master, signal.SIGKILL)
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < 30:
        if not any(alive(worker) for worker in workers):
            break
        time.sleep(0.1)
    gone_after = time.monotonic() - killed_at
    assert not any(alive(worker) for worker in workers), "the old master's workers still run"
    while time.monotonic() - killed_at < 60:
        new = supervised_pids().get("api")
        if (
            new not in (None, master)
            and children_of(new)
            and call(f"{platform.api}/readyz")[0] == 200
        ):
            break
        time.sleep(0.2)
    else:
        pytest.fail(platform.log_path.read_text()[-3000:])
    serving_after = time.monotonic() - killed_at
    # A master that cannot bind the port exits after about five seconds of retries, and
    # the supervisor starts another: the one serving now stays.
    time.sleep(6)
    assert supervised_pids().get("api") == new, platform.log_path.read_text()[-3000:]
    print(
        f"after SIGKILL: old workers gone in {gone_after:.1f} s, "
        f"a new master serving in {serving_after:.1f} s"
    )


def launcher(python: str, *args: str, env: dict, timeout: float = 60):
    """`python scripts/stack.py ARGS` as a user in another terminal runs it."""
    return subprocess.run(
        [python, "scripts/stack.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def terminal_env(platform) -> dict:
    """The platform's environment without the URLs: found from .data/platform.json."""
    return {k: v for k, v in platform.env.items() if k not in ("DATABASE_URL", "REDIS_URL")}


def test_stack_run_attaches_to_the_running_platform_and_leaves_it_untouched(platform):
    before = supervised_pids()
    env = terminal_env(platform)
    show_urls = "import os; print(os.environ['DATABASE_URL'], os.environ['REDIS_URL'])"
    attached = launcher(PYTHON, "run", "--", "python", "-c", show_urls, env=env)
    assert attached.returncode == 0, attached.stderr
    assert "attached to the running platform" in attached.stdout + attached.stderr
    assert attached.stdout.split()[-2:] == [platform.env["DATABASE_URL"], platform.env["REDIS_URL"]]
    again = launcher(PYTHON, "up", env=env)
    assert again.returncode == 1 and "already runs" in again.stdout + again.stderr
    assert supervised_pids() == before  # nothing started, stopped or restarted
    assert call(f"{platform.api}/readyz")[0] == 200


def test_stack_run_from_a_python_outside_the_virtualenv_runs_the_projects_python(platform):
    """README step 2 as a new user types it: `python scripts/stack.py run -- python
    manage.py ...` with the shell's own Python, not the virtualenv's."""
    outside = getattr(sys, "_base_executable", "")
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("this checkout's virtualenv is not at .venv (the launcher uses it there)")
    if not outside or Path(outside).parent == Path(PYTHON).parent:
        pytest.skip("no Python interpreter outside the virtualenv on this machine")
    env = terminal_env(platform) | {"PATH": f"{Path(outside).parent}:/usr/bin:/bin"}
    script = (
        "import os, sys; from apps.jobs.models import Job; "
        "print('prefix', os.path.realpath(sys.prefix), Job.objects.count() >= 0)"
    )
    ran = launcher(
        outside, "run", "--", "python", "manage.py", "shell", "-c", script, env=env, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert "attached to the running platform" in ran.stdout + ran.stderr
    assert f"prefix {(ROOT / '.venv').resolve()} True" in ran.stdout, ran.stdout
