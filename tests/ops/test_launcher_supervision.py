"""The launcher supervises: a GPU worker or beat killed under `make up` is back within
seconds, the API answers throughout, and every job still ends with its hold settled
exactly (the ledger's reconciler finds nothing).

Runs `scripts/stack.py up` itself, as a user does, on a scratch database of the test
server (and the test Redis), on free ports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.conf import settings

from tests.ops.live_stack import stack_py
from tests.worker_harness import ROOT

pytestmark = pytest.mark.e2e
SCRATCH = "gantry_launcher_test"


def _admin_url() -> str:
    base = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry"))
    return urlunsplit(base._replace(path="/postgres"))


def call(url: str, *, key: str = "", body: dict | None = None, timeout: float = 10):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers.update({"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex})
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    except (urllib.error.URLError, OSError):
        return 0, {}  # not answering (yet)


def supervised_pids(conf) -> dict[str, int]:
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "supervisorctl"), "-c", str(conf), "status"],
        capture_output=True,
        text=True,
    ).stdout
    pids = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "RUNNING":
            pids[parts[0]] = int(parts[3].rstrip(","))
    return pids


@pytest.fixture
def platform(tmp_path):
    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{SCRATCH}"')
    database_url = urlunsplit(urlsplit(_admin_url())._replace(path=f"/{SCRATCH}"))
    api_port, flower_port, metrics_base = (stack_py.free_port() for _ in range(3))
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": settings.REDIS_URL,
        "GANTRY_API_PORT": str(api_port),
        "GANTRY_FLOWER_PORT": str(flower_port),
        "GANTRY_METRICS_PORT_BASE": str(metrics_base),
        "GANTRY_API_WORKERS": "1",
        "GANTRY_HEARTBEAT_S": "0.5",
        "GANTRY_LEASE_S": "6",
        "GANTRY_REPUBLISH_AFTER_S": "2",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = (tmp_path / "up.log").open("wb")
    launcher = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "python"), "scripts/stack.py", "up"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    api = f"http://127.0.0.1:{api_port}"
    try:
        deadline = time.monotonic() + 120
        key = ""
        while time.monotonic() < deadline and not key:
            text = (tmp_path / "up.log").read_text(errors="replace")
            lines = text.splitlines()
            for i, line in enumerate(lines):
                if "Operator key (shown once)" in line and i + 1 < len(lines):
                    key = lines[i + 1].strip()
            assert launcher.poll() is None, text[-3000:]
            time.sleep(0.5)
        assert key, "the launcher printed no operator key"
        while call(f"{api}/readyz")[0] != 200:
            assert time.monotonic() < deadline, "the API did not get ready"
            time.sleep(0.5)
        yield api, key, env, tmp_path / "up.log"
    finally:
        os.killpg(launcher.pid, signal.SIGINT)
        try:
            launcher.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
        with psycopg.connect(_admin_url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')


def test_a_killed_gpu_worker_and_beat_come_back_and_every_job_settles_exactly(platform):
    api, operator, env, log_path = platform
    conf = ROOT / ".data" / "supervisor" / "supervisord.conf"
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
    before = supervised_pids(conf)
    killed_at = time.monotonic()
    for name in ("worker-h100-1", "beat"):
        os.kill(before[name], signal.SIGKILL)
    back = {}
    while len(back) < 2 and time.monotonic() - killed_at < 20:
        now = supervised_pids(conf)
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
    reconcile = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "manage.py", "reconcile_ledger"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr
    print(f"back after SIGKILL: {', '.join(f'{n} {s:.1f} s' for n, s in back.items())}")
