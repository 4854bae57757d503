"""The platform as `make up` starts it, for the tests that need the whole of it: runs
`scripts/stack.py up` itself, as a user does, on a scratch database of the test server
(and the test Redis), on free ports. One per test module that uses it (`platform`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.conf import settings

from tests.ops.live_stack import stack_py
from tests.worker_harness import ROOT

SCRATCH = "gantry_launcher_test"
PYTHON = str(ROOT / ".venv" / "bin" / "python")
SUPERVISOR_CONF = ROOT / ".data" / "supervisor" / "supervisord.conf"


@dataclass
class Platform:
    api: str
    operator_key: str
    env: dict
    log_path: Path

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True
        )


def _admin_url() -> str:
    base = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry"))
    return urlunsplit(base._replace(path="/postgres"))


def call(
    url: str,
    *,
    key: str = "",
    body: dict | None = None,
    timeout: float = 10,
    method: str | None = None,
):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers.update({"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex})
    request = urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")
    except (urllib.error.URLError, OSError):
        return 0, {}  # not answering (yet)


def funded_tenant_key(platform: Platform) -> str:
    """A key of a new paid org, "acme", with a project "video" and 500 credits."""
    api, operator = platform.api, platform.operator_key
    status, org = call(f"{api}/v1/orgs", key=operator, body={"name": "acme", "tier": "paid"})
    assert status == 201, org
    call(f"{api}/v1/orgs/{org['id']}/projects", key=operator, body={"name": "video"})
    grant = {"org": org["id"], "amount": 500_000_000, "kind": "paid"}
    assert call(f"{api}/v1/credits/grants", key=operator, body=grant)[0] == 201
    return call(f"{api}/v1/api-keys", key=operator, body={"org": org["id"]})[1]["key"]


def supervised_pids(conf: Path = SUPERVISOR_CONF) -> dict[str, int]:
    """Program name -> pid of the platform's running processes (supervisorctl status)."""
    return stack_py.running_programs(conf)


def supervised_once_running(names: set[str], *, timeout: float = 30.0) -> dict[str, int]:
    """`supervised_pids()` once every program of `names` is RUNNING: supervisord reports a
    program STARTING for its first second, longer on a loaded machine."""
    deadline = time.monotonic() + timeout
    while not names <= (pids := supervised_pids()).keys():
        missing = names - pids.keys()
        assert time.monotonic() < deadline, f"not RUNNING after {timeout:.0f} s: {missing}"
        time.sleep(0.2)
    return pids


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    with launched_platform(tmp_path_factory.mktemp("platform")) as running:
        yield running
    drop_scratch_database()


def drop_scratch_database() -> None:
    with psycopg.connect(_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')


@contextlib.contextmanager
def launched_platform(
    tmp_path,
    *,
    fresh_database: bool = True,
    api_port: int | None = None,
    extra_env: dict[str, str] | None = None,
):
    """`scripts/stack.py up` on the scratch database (made anew unless `fresh_database`
    is False: a restart of the same platform), with `extra_env` (settings of the
    launcher or the platform), until the block ends (Ctrl-C)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    if fresh_database:
        drop_scratch_database()
        with psycopg.connect(_admin_url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{SCRATCH}"')
    database_url = urlunsplit(urlsplit(_admin_url())._replace(path=f"/{SCRATCH}"))
    flower_port, metrics_base = stack_py.free_port(), stack_py.free_port()
    api_port = api_port or stack_py.free_port()
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
        **(extra_env or {}),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = (tmp_path / "up.log").open("wb")
    launcher = subprocess.Popen(
        [PYTHON, "scripts/stack.py", "up"],
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
        yield Platform(api=api, operator_key=key, env=env, log_path=tmp_path / "up.log")
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited already
            os.killpg(launcher.pid, signal.SIGINT)
        try:
            launcher.wait(timeout=40)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, signal.SIGKILL)
