"""Write a synthetic workload trace in the simulator's trace format, in a shape the bursty
scenario's generator does not make, to replay as a trace the policy was not tuned on.

    python scripts/synthetic_trace.py heavy-tenants /tmp/heavy.csv
    python -m apps.scheduler.simulate --scenario trace --trace /tmp/heavy.csv --load 2

Shapes:
- `heavy-tenants`: 8,000 jobs over about 3.4 hours from 30 orgs of up to 8 users, four of
  which submit 60 % of the jobs; 1, 2, 4 and 8 GPUs (70 / 12 / 10 / 8 %); run times
  log-normal around 10 minutes, up to 10 hours; half of the jobs constrain the GPU type;
  arrivals alternate between quiet and busy half-hours.
- `short-requests`: 26,000 single-GPU requests over about 80 minutes from 4,000
  tenants, ten of which send 40 % of them; run times log-normal around 23 s; bursts of
  four times the base rate lasting one to ten minutes.
- `gang-heavy`: about 1,100 jobs over 6 hours from 200 orgs whose volumes fall off as a
  power law (the first sends about a fifth); 1, 2, 4 and 8 GPUs (55 / 15 / 18 / 12 %),
  any type; run times log-normal around 15 minutes, up to 2 hours; arrivals rise and
  fall over two-hour cycles; half of the enterprise jobs cannot be preempted.
- `inference-and-training`: about 12,900 jobs over 2 hours from 300 orgs (5 % enterprise,
  25 % paid, 70 % free; volumes fall off as a power law), arrivals rising and falling
  over a two-hour cycle: 93 % single-GPU inference requests (log-normal around 20 s),
  7 % training runs of 2, 4 or 8 GPUs (log-normal around 30 minutes); half of the rows
  constrain the GPU type to H100 or A100; free is always preemptible, paid mostly
  (80 %), enterprise mostly not (40 %).
- `short-gangs`: 3,000 short jobs over about 100 minutes (arrivals a Poisson stream)
  from 300 orgs of 3 users (20 % enterprise, 40 % paid, 40 % free jobs); 1, 2 and 4 GPUs
  and half a GPU (3 / 1 / 1 / 1 in 6); run times log-normal around 20 s with a long
  tail (sigma 1); a quarter of the rows want a T4, which only T4 nodes have; free is
  always preemptible, paid half the time, enterprise never. Short jobs of several GPUs
  that never reach a checkpoint in the replay's default: a preemption costs all their
  progress (docs/scheduler-experiments.md, "Short gangs that never reach a checkpoint").

Columns: submit_s,duration_s,gpu_count,gpu_types,tier,org,user,preemptible (see
../shared/traces/README.md). Seeded: the same arguments write the same file.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys

HEADER = ("submit_s", "duration_s", "gpu_count", "gpu_types", "tier", "org", "user", "preemptible")


def heavy_tenants(rng: random.Random) -> list[tuple]:
    orgs = [f"o{i}" for i in range(30)]
    tiers = {org: rng.choices(("enterprise", "paid", "free"), (0.15, 0.45, 0.4))[0] for org in orgs}
    heavy = orgs[:4]
    rows, now, jobs, span = [], 0.0, 8000, 6 * 3600
    for _ in range(jobs):
        quiet = int(now / 1800) % 3 == 0
        now += rng.expovariate(1.0) * span / jobs * (0.3 if quiet else 1.5)
        org = rng.choice(heavy) if rng.random() < 0.6 else rng.choice(orgs)
        tier = tiers[org]
        gpus = rng.choices((1, 2, 4, 8), (0.7, 0.12, 0.1, 0.08))[0]
        run_s = min(36_000, max(5, rng.lognormvariate(math.log(600), 1.6)))
        types = rng.choice(("", "", "A100", "H100|A100"))
        preemptible = tier != "enterprise" and rng.random() < 0.8
        user = f"{org}-u{rng.randint(1, 8)}"
        rows.append((int(now), int(run_s), gpus, types, tier, org, user, str(preemptible).lower()))
    return rows


def short_requests(rng: random.Random) -> list[tuple]:
    tenants = [f"t{i}" for i in range(4000)]
    tiers = {t: rng.choices(("enterprise", "paid", "free"), (0.03, 0.27, 0.7))[0] for t in tenants}
    heavy = tenants[:10]
    rows, now, burst_until, jobs = [], 0.0, 0.0, 26_000
    for _ in range(jobs):
        if rng.random() < 0.002:
            burst_until = now + rng.uniform(60, 600)
        rate = 6.0 if now < burst_until else 1.6  # a burst: about four times the base
        now += rng.expovariate(rate) * 3 * 3600 / jobs * 2.4  # about 80 minutes in all
        tenant = rng.choice(heavy) if rng.random() < 0.4 else rng.choice(tenants)
        tier = tiers[tenant]
        run_s = max(2, rng.lognormvariate(math.log(23), 0.8))
        preemptible = tier != "enterprise"
        user = f"{tenant}-u1"
        rows.append((int(now), int(run_s), 1, "", tier, tenant, user, str(preemptible).lower()))
    return rows


def gang_heavy(rng: random.Random) -> list[tuple]:
    orgs = [f"o{i}" for i in range(200)]
    volume = [1 / (i + 1) ** 1.1 for i in range(200)]
    tiers = {org: rng.choices(("enterprise", "paid", "free"), (0.15, 0.45, 0.4))[0] for org in orgs}
    rows, now, span = [], 0.0, 6 * 3600
    while True:
        rate = 0.05 * (1 + 0.8 * math.sin(2 * math.pi * now / 7200))  # jobs per second
        now += rng.expovariate(rate)
        if now >= span:
            return rows
        org = rng.choices(orgs, volume)[0]
        tier = tiers[org]
        gpus = rng.choices((1, 2, 4, 8), (0.55, 0.15, 0.18, 0.12))[0]
        run_s = min(7200, rng.lognormvariate(math.log(900), 1.0))
        preemptible = not (tier == "enterprise" and rng.random() < 0.5)
        user = f"{org}-u{rng.randrange(3)}"
        rows.append((int(now), int(run_s), gpus, "", tier, org, user, str(preemptible).lower()))


def inference_and_training(rng: random.Random) -> list[tuple]:
    orgs = [f"c{i}" for i in range(300)]
    tiers = {
        org: rng.choices(("enterprise", "paid", "free"), (0.05, 0.25, 0.70))[0] for org in orgs
    }
    volume = [1 / (i + 1) ** 1.1 for i in range(len(orgs))]
    rows, now, span = [], 0.0, 2 * 3600
    while True:
        rate = 1.6 * (1 + 0.8 * math.sin(2 * math.pi * now / 7200)) + 0.2  # jobs per second
        now += rng.expovariate(rate)
        org = rng.choices(orgs, volume)[0]
        tier = tiers[org]
        if rng.random() < 0.93:  # an inference request
            run_s, gpus = max(2, rng.lognormvariate(math.log(20), 0.9)), 1
        else:  # a training run
            run_s, gpus = rng.lognormvariate(math.log(1800), 0.8), rng.choice((2, 4, 8))
        preemptible = (
            tier == "free"
            or (tier == "paid" and rng.random() < 0.8)
            or (tier == "enterprise" and rng.random() < 0.4)
        )
        types = rng.choice(("", "", "", "H100", "A100", "H100|A100"))
        user = f"{org}-u{rng.randrange(4)}"
        if now >= span:
            return rows
        rows.append(
            (round(now, 3), round(run_s, 1), gpus, types, tier, org, user, str(preemptible).lower())
        )


def short_gangs(rng: random.Random) -> list[tuple]:
    tiers = ("enterprise", "paid", "free")
    rows, now = [], 0.0
    for _ in range(3000):
        now += rng.expovariate(1 / 2.0)
        tier = rng.choices(tiers, (0.2, 0.4, 0.4))[0]
        gpus = rng.choice((1, 1, 1, 2, 4, 0.5))
        run_s = rng.lognormvariate(math.log(20), 1.0)
        types = rng.choice(("", "H100", "A100|H100", "T4"))
        org = f"org{rng.randint(1, 300)}"
        preemptible = tier == "free" or (tier == "paid" and rng.random() < 0.5)
        user = f"{org}-u{rng.randint(1, 3)}"
        rows.append(
            (round(now, 3), round(run_s, 2), gpus, types, tier, org, user, str(preemptible).lower())
        )
    return rows


SHAPES = {
    "heavy-tenants": (heavy_tenants, 3),
    "short-requests": (short_requests, 5),
    "gang-heavy": (gang_heavy, 1),
    "inference-and-training": (inference_and_training, 34),
    "short-gangs": (short_gangs, 1),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("path", help="the CSV file to write")
    parser.add_argument("--seed", type=int, help="default: the seed of the documented runs")
    args = parser.parse_args(argv)
    make, seed = SHAPES[args.shape]
    rows = make(random.Random(seed if args.seed is None else args.seed))
    with open(args.path, "w", newline="") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(HEADER)
        writer.writerows(rows)
    print(f"{args.path}: {len(rows):,} jobs over {rows[-1][0]:,} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
