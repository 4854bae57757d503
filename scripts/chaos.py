"""Chaos against a running `make up`: tenants submit while processes are killed.

    python scripts/stack.py run -- python scripts/chaos.py --operator-key gk_... [--duration 240]

Three tiers of tenants (two orgs each) submit short jobs through the REST API for
--duration seconds, resending each submission with its Idempotency-Key until it gets an
answer that is not a 5xx. Meanwhile, every 8-20 s, one process of the platform gets
SIGKILL: the API's master, beat, the control worker, a GPU-pool worker, and the embedded
PostgreSQL and Valkey when `make up` runs them. Then the killing stops, the jobs drain,
and the platform's database is checked: every job ended and succeeded, one job per
Idempotency-Key, no two attempts of a job ran at once, one succeeded attempt per
succeeded job, no hold left open, and `manage.py reconcile_ledger` finds nothing.
Exit status 0 when every check holds.

With `--no-kills` it is a soak: the same tenants and checks, nothing killed, and (with
any run) `--memory-every S` samples each program's resident memory (with its children:
gunicorn's master and workers), Valkey's `used_memory` and the database's size, and
prints each series at seven points over the run with its growth per hour.

Found this way (2026-12-03): uvicorn workers that outlived a killed API master, a 500
when PostgreSQL died mid-submission, and Celery 5.7.0 workers that died with a broker
restart (docs/operations.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil
import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import stack  # noqa: E402  (scripts/stack.py, beside this script)

from gantry_client.api import ApiError, GantryAPI, TransportError  # noqa: E402

DATA = ROOT / ".data"
TIERS = ("free", "paid", "enterprise")
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
SPARED = {"flower"}  # an operator's window, not the platform: killing it proves nothing


def create_tenants(operator: GantryAPI, *, run: str) -> list[GantryAPI]:
    tenants = []
    for tier in TIERS:
        for n in range(2):
            org = operator.request(
                "POST", "/v1/orgs", body={"name": f"chaos-{run}-{tier}-{n}", "tier": tier}
            ).data
            operator.request("POST", f"/v1/orgs/{org['id']}/projects", body={"name": "chaos"})
            operator.request(
                "POST",
                "/v1/credits/grants",
                body={"org": org["id"], "amount": 10**12, "kind": "paid"},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            key = operator.request("POST", "/v1/api-keys", body={"org": org["id"]}).data["key"]
            tenants.append(GantryAPI(operator.base_url, key, timeout=10))
    return tenants


class Submitter:
    """Submits until stopped; every job id the API accepted, by Idempotency-Key."""

    def __init__(self, tenants: list[GantryAPI], *, seed: int, stop: threading.Event):
        self.tenants, self.rng, self.stop = tenants, random.Random(seed), stop
        self.accepted: dict[str, str] = {}
        self.answers: Counter = Counter()
        self.broken_replays: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            self.submit_one(self.rng.choice(self.tenants))
            time.sleep(self.rng.uniform(0.2, 1.5))

    def submit_one(self, tenant: GantryAPI) -> None:
        key = uuid.uuid4().hex
        spec = {
            "project": "chaos",
            "params": {
                "prompt": f"chaos {key[:8]}",
                "steps": self.rng.randint(4, 12),
                "step_seconds": self.rng.choice([0.5, 1.0]),
            },
            "resources": {"gpu_count": self.rng.choice([1, 1, 1, 2])},
            "max_runtime_s": 120,
            "preemptible": self.rng.random() < 0.7,
        }
        for _ in range(60):  # the same key until an answer that is not a 5xx
            try:
                job_id = tenant.submit_job(spec, idempotency_key=key).data["id"]
            except TransportError:
                self.answers["no answer"] += 1
            except ApiError as error:
                self.answers[error.status] += 1
                if error.status < 500:
                    return
            else:
                self.answers[202] += 1
                if self.accepted.setdefault(key, job_id) != job_id:
                    self.broken_replays.append(key)
                return
            time.sleep(1)


def kill_targets(env: dict) -> dict[str, int]:
    """Program name -> pid: supervisord's programs, and the embedded servers of .data."""
    targets = {name: pid for name, pid in stack.running_programs().items() if name not in SPARED}
    postmaster = DATA / "postgres" / "postmaster.pid"
    if str(DATA / "postgres") in env.get("DATABASE_URL", "") and postmaster.exists():
        targets["postgres"] = int(postmaster.read_text().split()[0])
    redis_port = int(env.get("REDIS_URL", "redis://:0").rsplit(":", 1)[1].split("/")[0] or 0)
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if "valkey-server" in cmdline and f":{redis_port}" in cmdline:
            targets["valkey"] = process.pid
    return targets


def memory_sample(env: dict) -> dict[str, float]:
    """MiB by process (RSS, a program with its children), Valkey's used memory, the
    database's size."""
    # supervisord's programs only: PostgreSQL's RSS counts the shared buffers each
    # backend touched, so the database is measured by its size instead.
    sample = {}
    for name, pid in stack.running_programs().items():
        try:
            process = psutil.Process(pid)
            rss = process.memory_info().rss + sum(
                child.memory_info().rss for child in process.children(recursive=True)
            )
        except psutil.Error:
            continue
        sample[name] = rss / 2**20
    try:
        info = redis.Redis.from_url(env["REDIS_URL"]).info("memory")
        sample["valkey used_memory"] = info["used_memory"] / 2**20
    except redis.RedisError:
        pass
    try:
        with psycopg.connect(env["DATABASE_URL"]) as conn:
            size = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]
        sample["database size"] = size / 2**20
    except psycopg.Error:
        pass
    return sample


def sample_memory(env: dict, *, every: float, stop: threading.Event, samples: list) -> None:
    while not stop.wait(every):
        samples.append((time.monotonic(), memory_sample(env)))


def print_memory(samples: list, *, columns: int = 7) -> None:
    """Each series at `columns` evenly spaced samples (the first and the last among
    them), its peak, and its growth per hour from the first sample to the last."""
    if len(samples) < 2:
        return
    t0, t1 = samples[0][0], samples[-1][0]
    columns = min(columns, len(samples))
    picked = [samples[round(i * (len(samples) - 1) / (columns - 1))] for i in range(columns)]
    print(f"memory, MiB: {len(samples)} samples over {(t1 - t0) / 60:.1f} min")
    print(
        f"  {'minute':<22}"
        + "".join(f"{(t - t0) / 60:>8.1f}" for t, _sample in picked)
        + f"{'max':>8} {'per hour':>9}"
    )
    for name in sorted(set(samples[0][1]) & set(samples[-1][1])):
        series = "".join(f"{sample.get(name, float('nan')):>8.1f}" for _t, sample in picked)
        peak = max(sample.get(name, 0) for _t, sample in samples)
        growth = (samples[-1][1][name] - samples[0][1][name]) / ((t1 - t0) / 3600)
        print(f"  {name:<22}{series}{peak:>8.1f} {growth:>+9.1f}")


def killer(env: dict, *, seed: int, stop: threading.Event, killed: list[str]) -> None:
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(8, 20)):
        targets = kill_targets(env)
        if not targets:
            continue
        name = rng.choice(sorted(targets))
        try:
            os.kill(targets[name], signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.append(name)
        print(f"{time.strftime('%H:%M:%S')} SIGKILL {name} (pid {targets[name]})", flush=True)


CHECKS = {
    "every job ended, and succeeded": """
        SELECT count(*) FROM jobs_job WHERE id = ANY(%(ids)s) AND status <> 'succeeded'""",
    "one job per Idempotency-Key": """
        SELECT count(*) FROM (SELECT 1 FROM jobs_job WHERE id = ANY(%(ids)s)
         GROUP BY org_id, idempotency_key HAVING count(*) > 1) AS twice""",
    "no two attempts of a job ran at once": """
        SELECT count(*) FROM jobs_attempt a JOIN jobs_attempt b
            ON a.job_id = b.job_id AND a.number < b.number
         WHERE a.job_id = ANY(%(ids)s) AND a.started_at IS NOT NULL
           AND b.started_at < coalesce(a.finished_at, now())""",
    "one succeeded attempt per succeeded job": """
        SELECT count(*) FROM (SELECT j.id FROM jobs_job j
          LEFT JOIN jobs_attempt a ON a.job_id = j.id AND a.exit_class = 'succeeded'
         WHERE j.id = ANY(%(ids)s) AND j.status = 'succeeded'
         GROUP BY j.id HAVING count(a.id) <> 1) AS odd""",
    "no hold left open": """
        SELECT count(*) FROM ledger_hold h JOIN jobs_job j ON j.hold_id = h.id
         WHERE j.id = ANY(%(ids)s) AND h.state = 'active'""",
}


def drain(database_url: str, ids: list[str], *, timeout: float) -> int:
    """Wait for every job to end; how many had not when the time ran out."""
    deadline, left = time.monotonic() + timeout, len(ids)
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(database_url) as conn:
                left = conn.execute(
                    "SELECT count(*) FROM jobs_job WHERE id = ANY(%s) AND NOT status = ANY(%s)",
                    [ids, list(TERMINAL)],
                ).fetchone()[0]
        except psycopg.OperationalError:
            pass  # PostgreSQL was killed last and is being started again
        if left == 0:
            return 0
        time.sleep(5)
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="http://127.0.0.1:8000")
    parser.add_argument("--operator-key", required=True)
    parser.add_argument("--duration", type=float, default=240, help="seconds of submissions")
    parser.add_argument("--drain", type=float, default=900, help="seconds to wait for the jobs")
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-kills", dest="kills", action="store_false", help="a soak: nothing killed"
    )
    parser.add_argument(
        "--memory-every", type=float, default=0, help="sample memory every S seconds (0: off)"
    )
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if "DATABASE_URL" not in env:
        parser.error("DATABASE_URL is unset: run it under `python scripts/stack.py run --`")

    run = f"{args.seed}-{uuid.uuid4().hex[:6]}"
    tenants = create_tenants(GantryAPI(args.api, args.operator_key), run=run)
    stop, killed, samples = threading.Event(), [], []
    submitters = [
        Submitter(tenants, seed=args.seed * 100 + i, stop=stop) for i in range(args.submitters)
    ]
    threads = [threading.Thread(target=s.run) for s in submitters]
    if args.kills:
        threads.append(
            threading.Thread(
                target=killer,
                args=(env,),
                kwargs={"seed": args.seed, "stop": stop, "killed": killed},
            )
        )
    if args.memory_every:
        samples.append((time.monotonic(), memory_sample(env)))
        threads.append(
            threading.Thread(
                target=sample_memory,
                args=(env,),
                kwargs={"every": args.memory_every, "stop": stop, "samples": samples},
            )
        )
    for thread in threads:
        thread.start()
    time.sleep(args.duration)
    stop.set()
    for thread in threads:
        thread.join()

    accepted = {k: v for s in submitters for k, v in s.accepted.items()}
    answers = sum((s.answers for s in submitters), Counter())
    print(f"killed: {dict(Counter(killed))}")
    print_memory(samples)
    print(f"answers to submissions: {dict(answers)}; {len(accepted)} jobs accepted")
    ids = list(accepted.values())
    left = drain(env["DATABASE_URL"], ids, timeout=args.drain)
    failures = [f"{left} job(s) had not ended after {args.drain:.0f} s"] if left else []
    failures += [
        f"a replay answered another job: {k}" for s in submitters for k in s.broken_replays
    ]
    if answers[500]:
        failures.append(f"{answers[500]} submission(s) answered 500")
    with psycopg.connect(env["DATABASE_URL"]) as conn:
        for name, sql in CHECKS.items():
            found = conn.execute(sql, {"ids": ids}).fetchone()[0]
            print(
                f"{'ok  ' if found == 0 else 'FAIL'} {name}" + (f" ({found} not)" if found else "")
            )
            if found:
                failures.append(name)
        attempts = conn.execute(
            "SELECT exit_class, count(*) FROM jobs_attempt WHERE job_id = ANY(%s) GROUP BY 1",
            [ids],
        ).fetchall()
    print(f"attempts by exit class: {dict(attempts)}")
    reconcile = subprocess.run(
        [sys.executable, "manage.py", "reconcile_ledger"], cwd=ROOT, capture_output=True, text=True
    )
    print(
        reconcile.stdout.strip().splitlines()[-1] if reconcile.stdout.strip() else reconcile.stderr
    )
    if reconcile.returncode:
        failures.append("the ledger did not reconcile")
    print(json.dumps({"failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
