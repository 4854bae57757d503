"""Live demo load driver: three tiers of tenants submit a mixed load through the REST API.

    python scripts/stack.py run -- python scripts/demo.py --api http://127.0.0.1:8000 \
        --operator-key gk_... [--duration 60]

It creates one org per tier (free, paid, enterprise) with a project, an API key and a
credit grant, submits short jobs (a few with misbehaving prompts: !crash, !hang, !oom,
!slow) for --duration seconds, prints a status line every few seconds, then waits a
little for running work and prints per-tier start wait, GPU utilisation over the run and
the ledger reconciliation (`manage.py reconcile_ledger`, run with this environment).
Only the public API is used (gantry_client.api.GantryAPI, stdlib urllib underneath).
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gantry_client.api import ApiError, GantryAPI, TransportError  # noqa: E402

TIERS = ("free", "paid", "enterprise")
# Submissions per second per tier: together a little above what the demo fleet (10 GPUs,
# jobs of ~3 s) can run, so queues form and the scheduler's tier policy shows.
DEFAULT_RATES = {"free": 1.0, "paid": 1.5, "enterprise": 1.5}
MISBEHAVING = ("!crash", "!hang", "!oom", "!slow")
PROMPTS = ("a red fox in snow", "a lighthouse at dusk", "a bowl of ramen", "a paper crane")
GRANT_CREDITS = 10_000  # far above what a minute of holds on the demo fleet can take
MICRO = 1_000_000
TERMINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
STATUS_COLUMNS = ("queued", "running", "succeeded", "failed")


@dataclass
class Tenant:
    tier: str
    org_id: str
    project_id: str
    api: GantryAPI
    job_ids: list[str] = field(default_factory=list)
    refused: dict[int, int] = field(default_factory=dict)  # HTTP status -> count


# -- pure parts (tested) -----------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (fraction in 0..1) of the values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an ISO 8601 time from the API (None stays None)."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def start_waits(jobs: list[dict]) -> list[float]:
    """created_at → started_at in seconds, for the jobs that started."""
    waits = []
    for job in jobs:
        created, started = parse_time(job.get("created_at")), parse_time(job.get("started_at"))
        if created is not None and started is not None:
            waits.append(max(0.0, started - created))
    return waits


def gpu_utilisation(jobs: list[dict], *, fleet_gpus: int, window: tuple[float, float]) -> float:
    """Share of the fleet's GPU-seconds in the window that the jobs occupied (0..1).

    A job occupies gpu_count GPUs from started_at to finished_at (or the window's end
    while it still runs), clipped to the window.
    """
    begin, end = window
    if fleet_gpus <= 0 or end <= begin:
        return 0.0
    busy = 0.0
    for job in jobs:
        started = parse_time(job.get("started_at"))
        if started is None:
            continue
        finished = parse_time(job.get("finished_at")) or end
        overlap = min(finished, end) - max(started, begin)
        if overlap > 0:
            busy += overlap * int((job.get("resources") or {}).get("gpu_count") or 1)
    return busy / (fleet_gpus * (end - begin))


def status_counts(jobs: list[dict]) -> dict[str, int]:
    """queued (queued/scheduled), running (running/preempting), succeeded, failed (the rest)."""
    counts = dict.fromkeys(STATUS_COLUMNS, 0)
    for job in jobs:
        status = job.get("status")
        if status in ("queued", "scheduled"):
            counts["queued"] += 1
        elif status in ("running", "preempting"):
            counts["running"] += 1
        elif status == "succeeded":
            counts["succeeded"] += 1
        else:
            counts["failed"] += 1
    return counts


def format_status(elapsed: float, counts_by_tier: dict[str, dict[str, int]]) -> str:
    """One live line: t=12s  free q/r/ok/fail 3/2/10/0  paid ..."""
    parts = [f"t={elapsed:4.0f}s"]
    for tier, counts in counts_by_tier.items():
        parts.append(f"{tier} q/r/ok/fail {'/'.join(str(counts[c]) for c in STATUS_COLUMNS)}")
    return "  ".join(parts)


def format_wait_table(waits_by_tier: dict[str, list[float]], unstarted: dict[str, int]) -> str:
    """Per-tier start wait table (seconds)."""
    lines = [f"{'tier':<11} {'started':>7} {'never':>5} {'p50 s':>7} {'p95 s':>7} {'max s':>7}"]
    for tier, waits in waits_by_tier.items():
        cells = [percentile(waits, 0.5), percentile(waits, 0.95), max(waits, default=None)]
        shown = ["-" if c is None else f"{c:.1f}" for c in cells]
        lines.append(
            f"{tier:<11} {len(waits):>7} {unstarted.get(tier, 0):>5} "
            f"{shown[0]:>7} {shown[1]:>7} {shown[2]:>7}"
        )
    return "\n".join(lines)


def job_spec(rng: random.Random, *, project: str, misbehave_share: float) -> dict:
    """A short job: a few seconds on one (sometimes two) GPUs; now and then a bad prompt."""
    prompt = rng.choice(PROMPTS)
    if rng.random() < misbehave_share:
        prompt = f"{prompt} {rng.choice(MISBEHAVING)}"
    return {
        "project": project,
        "params": {
            "prompt": prompt,
            "seed": rng.randrange(1 << 16),
            "steps": rng.randint(4, 8),
            "step_seconds": 0.5,
        },
        "resources": {"gpu_count": 2 if rng.random() < 0.15 else 1},
        # Short enough that a !hang ends as timed_out within the demo.
        "max_runtime_s": 20,
        "preemptible": True,
    }


# -- talking to the API ------------------------------------------------------------------


def create_tenants(operator: GantryAPI, *, run_id: str) -> list[Tenant]:
    """One org per tier with a project, an org key and a credit grant."""
    tenants = []
    for tier in TIERS:
        org = operator.request(
            "POST", "/v1/orgs", body={"name": f"demo-{tier}-{run_id}", "tier": tier}
        ).data
        project = operator.request(
            "POST", f"/v1/orgs/{org['id']}/projects", body={"name": "demo"}
        ).data
        key = operator.request(
            "POST", "/v1/api-keys", body={"org": org["id"], "project": project["id"]}
        ).data
        operator.request(
            "POST",
            "/v1/credits/grants",
            body={"org": org["id"], "amount": GRANT_CREDITS * MICRO, "kind": "grant"},
            headers={"Idempotency-Key": f"demo-grant-{run_id}-{tier}"},
        )
        tenants.append(
            Tenant(tier, org["id"], project["id"], GantryAPI(operator.base_url, key["key"]))
        )
        print(f"  {tier:<11} org {org['id']}  project {project['id']}  {GRANT_CREDITS} credits")
    return tenants


def fleet_gpu_count(operator: GantryAPI) -> int:
    data = operator.request("GET", "/v1/fleet/nodes", query={"limit": 500}).data
    nodes = data.get("results", []) if isinstance(data, dict) else data
    return sum(int(n.get("gpu_count") or 0) for n in nodes if n.get("state") != "removed")


def all_jobs(tenant: Tenant) -> list[dict]:
    jobs, cursor = [], None
    while True:
        page = tenant.api.list_jobs(limit=500, cursor=cursor)
        jobs.extend(page.get("results", []))
        cursor = page.get("next")
        if not cursor:
            return jobs


def submit(tenant: Tenant, rng: random.Random, *, misbehave_share: float) -> None:
    spec = job_spec(rng, project=tenant.project_id, misbehave_share=misbehave_share)
    try:
        answer = tenant.api.submit_job(spec, idempotency_key=uuid.uuid4().hex)
    except ApiError as exc:  # 429 quota/rate, 402 credits: counted, the load goes on
        tenant.refused[exc.status] = tenant.refused.get(exc.status, 0) + 1
        return
    except TransportError:
        tenant.refused[0] = tenant.refused.get(0, 0) + 1
        return
    tenant.job_ids.append(answer.data["id"])


def snapshot(tenants: list[Tenant]) -> dict[str, list[dict]]:
    return {t.tier: all_jobs(t) for t in tenants}


def drive(args: argparse.Namespace) -> int:
    operator = GantryAPI(args.api, args.operator_key)
    rng = random.Random(args.seed)
    run_id = uuid.uuid4().hex[:6]
    fleet_gpus = args.fleet_gpus or fleet_gpu_count(operator)
    print(f"[demo] fleet: {fleet_gpus} GPUs; creating tenants (run {run_id})", flush=True)
    tenants = create_tenants(operator, run_id=run_id)
    rates = {"free": args.free_rate, "paid": args.paid_rate, "enterprise": args.enterprise_rate}
    print(
        f"[demo] submitting for {args.duration:.0f}s "
        f"(jobs/s: {', '.join(f'{k} {v:g}' for k, v in rates.items())}); "
        "watch with `gantry jobs list` (org key) or in Flower",
        flush=True,
    )
    begin = time.time()
    credit = dict.fromkeys(TIERS, 0.0)
    last_tick, next_status = begin, begin + args.status_every
    while (now := time.time()) < begin + args.duration:
        for tenant in tenants:
            credit[tenant.tier] += rates[tenant.tier] * (now - last_tick)
            while credit[tenant.tier] >= 1:
                credit[tenant.tier] -= 1
                submit(tenant, rng, misbehave_share=args.misbehave_share)
        last_tick = now
        if now >= next_status:
            counts = {tier: status_counts(jobs) for tier, jobs in snapshot(tenants).items()}
            print(format_status(now - begin, counts), flush=True)
            next_status = now + args.status_every
        time.sleep(0.1)
    load_end = time.time()

    print(f"[demo] load over; waiting up to {args.drain:.0f}s for queued and running jobs")
    deadline = load_end + args.drain
    while True:
        jobs = snapshot(tenants)
        pending = sum(1 for js in jobs.values() for j in js if j["status"] not in TERMINAL)
        if not pending or time.time() >= deadline:
            break
        counts = {tier: status_counts(js) for tier, js in jobs.items()}
        print(format_status(time.time() - begin, counts), flush=True)
        time.sleep(args.status_every)
    end = time.time()
    cancelled = 0
    for tenant in tenants:
        for job in jobs[tenant.tier]:
            if job["status"] not in TERMINAL:
                try:  # leave nothing holding credits behind the demo
                    tenant.api.cancel_job(job["id"])
                    cancelled += 1
                except ApiError:
                    pass  # finished meanwhile (409): nothing to release
    return report(tenants, jobs, fleet_gpus=fleet_gpus, window=(begin, end), cancelled=cancelled)


def report(
    tenants: list[Tenant],
    jobs: dict[str, list[dict]],
    *,
    fleet_gpus: int,
    window: tuple[float, float],
    cancelled: int,
) -> int:
    print("\n=== Gantry demo: results ===")
    print(f"run window {window[1] - window[0]:.0f}s, fleet {fleet_gpus} GPUs")
    print("\nJobs per tier (final status)")
    for tenant in tenants:
        by_status: dict[str, int] = {}
        for job in jobs[tenant.tier]:
            by_status[job["status"]] = by_status.get(job["status"], 0) + 1
        refused = ", ".join(f"{s or 'network'}×{n}" for s, n in sorted(tenant.refused.items()))
        shown = ", ".join(f"{k} {v}" for k, v in sorted(by_status.items()))
        print(f"  {tenant.tier:<11} {len(jobs[tenant.tier]):>4} jobs: {shown}")
        if refused:
            print(f"  {'':<11} refused at submission: {refused}")
    if cancelled:
        print(f"  ({cancelled} unfinished jobs cancelled at the end of the demo)")
    print("\nStart wait per tier (created_at → started_at)")
    waits = {t.tier: start_waits(jobs[t.tier]) for t in tenants}
    unstarted = {t.tier: sum(1 for j in jobs[t.tier] if not j.get("started_at")) for t in tenants}
    print(format_wait_table(waits, unstarted))
    every = [j for js in jobs.values() for j in js]
    share = gpu_utilisation(every, fleet_gpus=fleet_gpus, window=window)
    print(f"\nGPU utilisation over the run: {share:.0%} of {fleet_gpus} GPUs")
    print("\nLedger reconciliation (manage.py reconcile_ledger)")
    check = subprocess.run(
        [sys.executable, "manage.py", "reconcile_ledger"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    print((check.stdout + check.stderr).strip() or f"exit {check.returncode}")
    return check.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="http://127.0.0.1:8000", help="API base URL")
    parser.add_argument("--operator-key", required=True)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--drain", type=float, default=30.0, help="seconds to wait at the end")
    parser.add_argument("--status-every", type=float, default=5.0)
    parser.add_argument("--fleet-gpus", type=int, default=0, help="0: ask the API")
    parser.add_argument("--free-rate", type=float, default=DEFAULT_RATES["free"])
    parser.add_argument("--paid-rate", type=float, default=DEFAULT_RATES["paid"])
    parser.add_argument("--enterprise-rate", type=float, default=DEFAULT_RATES["enterprise"])
    parser.add_argument("--misbehave-share", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    return drive(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
