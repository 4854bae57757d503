"""What every benchmark shares: `--cpus` (pin the whole run) and the header it prints.

`--cpus 0,1` pins this process, every thread of it, before it starts anything: the client
processes, the servers it starts itself (gunicorn, pgbench) and their children inherit
the set. Servers started by others (the PostgreSQL and Redis of DATABASE_URL and
REDIS_URL, or the embedded ones of `scripts/stack.py run`) are not pinned by the
benchmark: the header says, for each, which CPUs it may use. `make bench CPUS=0,1` runs
each benchmark as `taskset -c 0,1 python scripts/stack.py run -- python bench/<name>.py
--cpus 0,1`, so embedded servers started for the run are inside the set too.

The header: the date, the machine (CPU model, CPUs, the pinned set), the Python, and the
servers; at exit, the wall time of the whole run.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import os
import platform
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit


def parse_cpus(text: str) -> set[int]:
    """'0,1', '0-3' or '0-1,4' -> the set of CPU numbers."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CPU list: {text!r} (e.g. 0,1 or 0-3)") from None
    if not cpus:
        raise argparse.ArgumentTypeError("an empty CPU list")
    return cpus


def add_cpus_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cpus",
        type=parse_cpus,
        metavar="LIST",
        help="pin the run (this process, its clients and the servers it starts) to these "
        "CPUs, e.g. 0,1 or 0-3 (servers started by others are not pinned: the header "
        "says which CPUs they may use)",
    )


def cpu_list(cpus) -> str:
    """{0, 1, 2, 5} -> '0-2,5'."""
    ordered, runs = sorted(cpus), []
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def pin(cpus: set[int] | None) -> None:
    """Pin every thread of this process to `cpus` (None: leave it as it is). Children
    started afterwards inherit the set."""
    if not cpus:
        return
    try:
        os.sched_setaffinity(0, cpus)
        for task in os.listdir("/proc/self/task"):  # threads started before this call
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task), cpus)
    except OSError as error:
        sys.exit(f"--cpus {cpu_list(cpus)}: {error} (this machine's CPUs: {machine_cpus()})")


def usable_cpus() -> int:
    """How many CPUs this process may run on (the pinned set, after --cpus)."""
    return len(os.sched_getaffinity(0))


def machine_cpus() -> str:
    return cpu_list(range(os.cpu_count() or 1))


def cpu_model() -> str:
    """The CPU model, sockets and cores, from /proc/cpuinfo (Linux)."""
    model, sockets, cores = platform.processor() or platform.machine(), set(), set()
    with contextlib.suppress(OSError):
        physical = "0"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                model = value
            elif key == "physical id":
                physical = value
                sockets.add(value)
            elif key == "core id":
                cores.add((physical, value))
    sockets_text = f"{len(sockets)} socket(s), " if sockets else ""
    cores_text = f"{len(cores)} physical core(s), " if cores else ""
    return f"{model}, {sockets_text}{cores_text}{os.cpu_count()} logical CPUs"


def _process_cpus(pid: int, names: tuple[str, ...]) -> str | None:
    """Cpus_allowed_list of `pid` when it is a local process whose name has one of
    `names` (a remote server's pid means nothing here); else None."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if not any(name in comm for name in names):
            return None
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _parent(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    return None


def _server_line(name: str, version: str, allowed: str | None, pid: int, pinned) -> str:
    """`allowed`: the server's Cpus_allowed_list, read while it was known to be alive
    (None: not a local process)."""
    if allowed is None:
        return f"{name} {version} (pid {pid}, not on this machine or not visible): not pinned"
    if not pinned:
        return f"{name} {version} (pid {pid}, started by others): may use CPUs {allowed}"
    where = (
        "all inside the pinned set"
        if parse_cpus(allowed) <= set(pinned)
        else f"beyond the pinned set {cpu_list(pinned)}"
    )
    return (
        f"{name} {version} (pid {pid}, started by others): NOT pinned by this benchmark; "
        f"it may use CPUs {allowed}, {where}"
    )


def postgres_line(url: str, pinned) -> str:
    """PostgreSQL's version and where its server process (the postmaster, whose
    backends share its CPU set) may run. Any database of the server will do: the
    benchmarks work in scratch ones, and DATABASE_URL's may not exist."""
    import psycopg

    error = None
    for candidate in (url, urlsplit(url)._replace(path="/postgres").geturl()):
        try:
            with psycopg.connect(candidate, connect_timeout=5) as conn:
                backend, version = conn.execute(
                    "SELECT pg_backend_pid(), current_setting('server_version')"
                ).fetchone()
                # While connected: the backend exits with the connection.
                pid = backend
                if _process_cpus(backend, ("postgres",)) is not None:
                    pid = _parent(backend) or backend
                allowed = _process_cpus(pid, ("postgres",))
            break
        except psycopg.Error as failed:
            error = failed
    else:
        first = str(error).strip().splitlines()[0] if error else ""
        return f"PostgreSQL: not reachable ({first})"
    return _server_line("PostgreSQL", version, allowed, pid, pinned)


def redis_line(url: str, pinned) -> str:
    import redis

    try:
        info = redis.Redis.from_url(url, socket_timeout=5).info("server")
    except redis.RedisError as error:
        return f"Redis: not reachable ({error})"
    name = "Valkey" if "valkey_version" in info else "Redis"
    version = info.get("valkey_version") or info.get("redis_version", "?")
    pid = int(info["process_id"])
    return _server_line(name, version, _process_cpus(pid, ("redis", "valkey")), pid, pinned)


def begin_run(
    name: str,
    cpus: set[int] | None,
    *,
    started_here: str = "",
    database_url: str | None = None,
    redis_url: str | None = None,
) -> None:
    """Pin (before anything is started), then print the header: date, machine, pinned
    set, Python, and which servers run inside the set."""
    pin(cpus)
    began = time.monotonic()
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    allowed = cpu_list(os.sched_getaffinity(0))
    pinned = (
        f"pinned to CPUs {cpu_list(cpus)} (--cpus)"
        if cpus
        else f"not pinned (may use CPUs {allowed})"
    )
    print(f"== {name}: {now}", flush=True)
    print(f"machine: {cpu_model()}; {platform.node()}; this run {pinned}")
    print(
        f"Python {platform.python_version()} ({platform.python_implementation()}, "
        f"{os.path.realpath(sys.executable)})"
    )
    if started_here:
        where = "inside the pinned set" if cpus else "not pinned"
        print(f"processes this benchmark starts ({where}): {started_here}")
    if database_url:
        print(postgres_line(database_url, cpus))
    if redis_url:
        print(redis_line(redis_url, cpus))
    print(flush=True)
    atexit.register(
        lambda: print(f"== {name}: done in {time.monotonic() - began:.0f} s", flush=True)
    )
