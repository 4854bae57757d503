"""Benchmark of the submission API: sustained POST /v1/jobs per second and latency.

    python bench/api.py                    # starts gunicorn itself on a scratch database
    python bench/api.py --url http://127.0.0.1:8000 --key gk_... --project NAME

Without --url it creates (and afterwards drops) the PostgreSQL database `gantry_bench_<pid>`
on the server of DATABASE_URL, migrates it, loads the demo fleet, creates an
enterprise org with room for the whole run (quota, rate, credit) and starts gunicorn
on it. Clients are processes x threads, each thread one keep-alive HTTP/1.1
connection (http.client) in a closed loop: every submission has a fresh
Idempotency-Key. After a warm-up, it measures submissions for --duration seconds, then
the same clients hitting /healthz for the same time as the baseline, and prints
throughput, p50/p99 latency and the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from _common import add_cpus_argument, begin_run, usable_cpus

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
# Per run, so that two runs on one server never drop each other's database.
SCRATCH_DB = f"gantry_bench_{os.getpid()}"

JOB_BODY = {
    "params": {"prompt": "a red fox in snow", "seed": 7, "steps": 20, "step_seconds": 0.5},
    "resources": {"gpu_count": 1, "gpu_types": ["H100", "A100"], "min_gpu_memory_gb": 40},
    "max_runtime_s": 600,
    "preemptible": True,
}


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# --- the load ----------------------------------------------------------------------------


def client_process(
    url: str,
    keys: list[str],
    project: str,
    mode: str,
    threads: int,
    start: float,
    warmup: float,
    duration: float,
    out,
):
    """One process of `threads` closed-loop clients (thread i submits with keys[i % len])
    from time.monotonic() `start` on; sends (latencies, statuses) to `out`."""
    parts = urlsplit(url)
    body_of = dict(JOB_BODY, project=project)
    measure_from, stop_at = start + warmup, start + warmup + duration
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    def loop(index: int):
        key = keys[index % len(keys)]
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
        local_lat, local_status = [], {}
        while time.monotonic() < start:
            time.sleep(0.001)
        while True:
            now = time.monotonic()
            if now >= stop_at:
                break
            if mode == "submit":
                payload = json.dumps(body_of).encode()
                headers = {
                    "Authorization": f"Bearer {key}",
                    "Content-Type": "application/json",
                    "Idempotency-Key": uuid.uuid4().hex,
                }
                method, path = "POST", "/v1/jobs"
            else:
                payload, headers, method, path = None, {}, "GET", "/healthz"
            began = time.perf_counter()
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                response.read()
                status = response.status
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
                conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
            took = time.perf_counter() - began
            if began_in_window(now, measure_from, stop_at):
                local_lat.append(took)
                local_status[status] = local_status.get(status, 0) + 1
        conn.close()
        with lock:
            latencies.extend(local_lat)
            for status, n in local_status.items():
                statuses[status] = statuses.get(status, 0) + n

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    out.put((latencies, statuses))


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def cpu_groups(client_pids: list[int], server_pid: int | None) -> dict[str, list[int]]:
    """Process ids by role: the client processes, gunicorn (master and workers), the
    PostgreSQL backends connected to the scratch database (empty when not local)."""
    groups = {"clients": client_pids, "gunicorn": [], "postgres": []}
    if server_pid is not None:
        groups["gunicorn"] = [server_pid, *children_of(server_pid)]
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    title = Path(f"/proc/{entry}/cmdline").read_bytes()
                    if title.startswith(b"postgres:") and f" {SCRATCH_DB} ".encode() in title:
                        groups["postgres"].append(int(entry))
    return groups


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process so far; None once it has exited."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_in_window(
    client_pids: list[int], server_pid: int | None, *, until: float, every: float = 0.5
) -> dict[str, float]:
    """CPU seconds each group used from now until `until` (time.monotonic()).

    Sampled every `every` s: a process that exits in the window (a PostgreSQL backend
    whose connection reached CONN_MAX_AGE and was reopened) counts up to its last
    sample instead of vanishing from the sum, and one that starts in it (the reopened
    connection's backend) counts from its start."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    role: dict[int, str] = {}
    opening = True
    while True:
        for name, pids in cpu_groups(client_pids, server_pid).items():
            for pid in pids:
                used = process_cpu(pid)
                if used is None:
                    continue
                role.setdefault(pid, name)
                first.setdefault(pid, used if opening else 0.0)
                last[pid] = used
        opening = False
        if time.monotonic() >= until:
            break
        time.sleep(max(0.0, min(every, until - time.monotonic())))
    totals = dict.fromkeys(("clients", "gunicorn", "postgres"), 0.0)
    for pid, name in role.items():
        totals[name] += last[pid] - first[pid]
    return totals


def began_in_window(now: float, measure_from: float, stop_at: float) -> bool:
    return measure_from <= now < stop_at


def run_load(
    args, mode: str, keys: list[str], project: str, server_pid: int | None, *, warmup: float
) -> dict:
    """One window of load: its raw latencies, statuses and CPU seconds by process group."""
    out = mp.Queue()
    # CLOCK_MONOTONIC is system-wide: every process starts, and the window opens, together.
    start = time.monotonic() + 0.5
    # Process p's thread i is client p * threads + i: with one org per client, each
    # client submits for its own org.
    procs = [
        mp.Process(
            target=client_process,
            args=(
                args.url,
                [keys[(p * args.threads + i) % len(keys)] for i in range(args.threads)],
                project,
                mode,
                args.threads,
                start,
                warmup,
                args.duration,
                out,
            ),
        )
        for p in range(args.processes)
    ]
    for proc in procs:
        proc.start()
    # CPU spent in the measured window by the clients, gunicorn and the bench database's
    # PostgreSQL backends (Linux /proc; absent elsewhere or for a remote server).
    sleep_until(start + warmup)
    cpu_used = cpu_in_window(
        [proc.pid for proc in procs], server_pid, until=start + warmup + args.duration
    )
    latencies, statuses = [], {}
    for _ in procs:
        lat, st = out.get()
        latencies += lat
        for status, n in st.items():
            statuses[status] = statuses.get(status, 0) + n
    for proc in procs:
        proc.join()
    return {"latencies": latencies, "statuses": statuses, "cpu_s": cpu_used, "s": args.duration}


def summarize(windows: list[dict]) -> dict:
    """The figures of one mode over its windows (the rounds of a run) together."""
    latencies = [latency for window in windows for latency in window["latencies"]]
    statuses: dict[int, int] = {}
    cpu_s: dict[str, float] = {}
    for window in windows:
        for status, n in window["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
        for name, used in window["cpu_s"].items():
            cpu_s[name] = cpu_s.get(name, 0.0) + used
    ok = ok_count(statuses)
    requests = sum(statuses.values())
    return {
        "cpu_ms": {name: used * 1000 / requests for name, used in cpu_s.items()}
        if requests
        else {},
        "ok_per_s": ok / sum(window["s"] for window in windows),
        "requests": requests,
        "statuses": dict(sorted(statuses.items())),
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "mean_ms": (statistics.fmean(latencies) * 1000) if latencies else float("nan"),
    }


def ok_count(statuses: dict[int, int]) -> int:
    return sum(n for status, n in statuses.items() if 200 <= status < 300)


def ok_per_s(window: dict) -> float:
    return ok_count(window["statuses"]) / window["s"]


# --- a scratch server ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scratch_database_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    return parts._replace(path=f"/{SCRATCH_DB}").geturl()


def recreate_database(base_url: str, *, drop_only: bool = False) -> None:
    import psycopg

    parts = urlsplit(base_url)
    admin_url = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{SCRATCH_DB}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{SCRATCH_DB}"')


SETUP_SCRIPT = """
from apps.accounts.services import create_org, create_project, issue_api_key
from apps.ledger import services as ledger
from apps.fleet.fleet_file import read_fleet_file
from apps.fleet.services import load_fleet

load_fleet(read_fleet_file(""))
for n in range(ORGS):
    org = create_org(
        name=f"bench-{n}", tier="enterprise", max_queued_jobs=10_000_000, rate_per_s=1e6,
        rate_burst=1_000_000,
    )
    create_project(org=org, name="bench")
    ledger.grant(org=org, amount=10**18, kind="paid")
    print("KEY", issue_api_key(org=org).raw_key)
"""


def database_url() -> str:
    """The server the scratch database is made on (DATABASE_URL's)."""
    return os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry")


def start_scratch_server(args) -> tuple[subprocess.Popen, dict]:
    base = database_url()
    recreate_database(base)
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": scratch_database_url(base),
            "REDIS_URL": args.redis_url,
            "GANTRY_LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "GANTRY_API_THREADS": str(args.server_threads),
        }
    )
    python = sys.executable
    subprocess.run([python, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    setup = subprocess.run(
        [python, "manage.py", "shell", "-c", f"ORGS = {args.orgs}\n{SETUP_SCRIPT}"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    keys = [line.split()[1] for line in setup.stdout.splitlines() if line.startswith("KEY ")]
    port = free_port()
    argv = [
        str(BIN / "gunicorn"),
        "config.wsgi" if args.worker_class in ("gthread", "sync") else "config.asgi:application",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        str(args.server_workers),
        "--worker-class",
        args.worker_class,
        "--threads",
        str(args.server_threads),
        "--keep-alive",
        "30",
        "--backlog",
        "2048",
        "--log-level",
        "warning",
    ]
    server = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    args.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("gunicorn did not come up")
        time.sleep(0.2)
    return server, {"keys": keys, "project": "bench", "env": env}


def stop_server(server: subprocess.Popen) -> None:
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(server.pid, signal.SIGKILL)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (else a scratch one is started)")
    parser.add_argument(
        "--key", action="append", help="org API key (with --url; repeat for several orgs)"
    )
    parser.add_argument(
        "--orgs", type=int, default=0, help="orgs to submit for (default: one per client)"
    )
    parser.add_argument("--project", default="bench", help="project name or id (with --url)")
    parser.add_argument("--processes", type=int, default=2, help="client processes")
    parser.add_argument("--threads", type=int, default=8, help="connections per process")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds first")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternate submissions and /healthz this many times (--duration each, the "
        "warm-up before the first; 1 s before the others): a ratio per round, so the "
        "machine's drift shows instead of skewing one ratio",
    )
    # The API's own settings (config/gunicorn.py: uvicorn workers, 4 request threads each
    # (GANTRY_API_THREADS); 3 workers by default).
    parser.add_argument("--server-workers", type=int, default=3)
    parser.add_argument("--server-threads", type=int, default=4)
    parser.add_argument(
        "--worker-class",
        default="config.uvicorn_worker.GantryUvicornWorker",
        help="config.uvicorn_worker.GantryUvicornWorker (config.asgi, as `make up` serves) or "
        "gthread "
        "(config.wsgi, the earlier server, for comparison)",
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    add_cpus_argument(parser)
    args = parser.parse_args(argv)

    server = None
    if args.url:
        if not args.key:
            parser.error("--url needs --key")
        begin_run(
            "bench/api.py",
            args.cpus,
            started_here=f"{args.processes} client processes (the server at {args.url} is "
            "not started here: not pinned by this benchmark)",
        )
        keys, project = args.key, args.project
    else:
        args.orgs = args.orgs or args.processes * args.threads
        begin_run(
            "bench/api.py",
            args.cpus,
            started_here=f"gunicorn (master and {args.server_workers} workers), "
            f"{args.processes} client processes, migrate and setup",
            database_url=database_url(),
            redis_url=args.redis_url,
        )
        server, info = start_scratch_server(args)
        keys, project = info["keys"], info["project"]
    try:
        clients = args.processes * args.threads
        served_by = (
            f"gunicorn {args.worker_class} {args.server_workers} workers x "
            f"{args.server_threads} threads"
            if server is not None
            else "the given server"
        )
        print(
            f"server {args.url} ({served_by}); {clients} keep-alive clients "
            f"({args.processes} processes x {args.threads} threads) for {len(keys)} org(s); "
            f"{args.warmup:g} s warm-up, {args.duration:g} s measured; "
            f"{usable_cpus()} CPUs usable"
        )
        # The interpreter's build moves the server's CPU per request (see the Makefile).
        print(f"server's Python: {platform.python_version()} ({os.path.realpath(sys.executable)})")
        load_before = os.getloadavg()[0]
        server_pid = server.pid if server is not None else None
        submits, healths = [], []
        for round_ in range(max(1, args.rounds)):
            warmup = args.warmup if round_ == 0 else 1.0
            submits.append(run_load(args, "submit", keys, project, server_pid, warmup=warmup))
            healths.append(run_load(args, "health", keys, project, server_pid, warmup=warmup))
        submit, health = summarize(submits), summarize(healths)
        load_after = os.getloadavg()[0]
    finally:
        if server is not None:
            stop_server(server)
            if not args.keep:
                recreate_database(database_url(), drop_only=True)
    for name, result in (("POST /v1/jobs", submit), ("GET /healthz", health)):
        print(
            f"{name:14s} {result['ok_per_s']:8.1f} ok/s  p50 {result['p50_ms']:6.1f} ms  "
            f"p99 {result['p99_ms']:6.1f} ms  mean {result['mean_ms']:6.1f} ms  "
            f"statuses {result['statuses']}"
        )
    for name, result in (("POST /v1/jobs", submit), ("GET /healthz", health)):
        if result["cpu_ms"]:
            parts = ", ".join(f"{who} {ms:.2f}" for who, ms in result["cpu_ms"].items())
            total = sum(result["cpu_ms"].values())
            print(f"{name:14s} CPU ms per request: {parts}; total {total:.2f}")
    # Other work on the machine skews every figure: say how busy it was.
    print(f"load average (1 min) before/after: {load_before:.1f} / {load_after:.1f}")
    ratio = submit["ok_per_s"] / health["ok_per_s"] if health["ok_per_s"] else float("nan")
    print(f"submissions / healthz throughput ratio: {ratio:.2f}")
    if len(submits) > 1:
        ratios = [
            ok_per_s(s) / ok_per_s(h) if ok_per_s(h) else float("nan")
            for s, h in zip(submits, healths, strict=True)
        ]
        rates = ", ".join(f"{ok_per_s(s):.0f}" for s in submits)
        print(
            f"per round: submissions/s {rates}; ratio {', '.join(f'{r:.3f}' for r in ratios)} "
            f"(median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f})"
        )
    # The reference machine's targets (issue 19): 2 cores, and 16 cores.
    postgres_ms = submit["cpu_ms"].get("postgres") if submit["cpu_ms"] else None
    if usable_cpus() >= 16:
        met = submit["ok_per_s"] >= 3000 and submit["p99_ms"] < 150
        print(f"target on 16 cores (>= 3,000 submissions/s, p99 < 150 ms): {verdict(met)}")
    else:
        met = (
            submit["ok_per_s"] >= 400
            and submit["p99_ms"] < 100
            and postgres_ms is not None
            and postgres_ms <= 1.0
        )
        print(
            "target on 2 cores (>= 400 submissions/s, p99 < 100 ms, <= 1.0 ms of PostgreSQL "
            f"CPU per submission): {verdict(met)}"
        )
    return 0


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


if __name__ == "__main__":
    sys.exit(main())
