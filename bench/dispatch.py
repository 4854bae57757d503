"""Dispatch tick benchmark (not a test): the whole tick against PostgreSQL at scale.

    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python bench/dispatch.py
    .venv/bin/python scripts/stack.py run -- python bench/dispatch.py   # embedded servers

bench/scheduler.py times the policy alone; this times what the beat tick does around it:
the snapshot read from PostgreSQL (fleet, live attempts, the queue window and its
backlog), the policy, and applying the decisions (one guarded transaction each, run
messages published on commit). It works in a scratch database it creates and drops
(test_gantry_bench_dispatch_<pid>) and publishes to its own Redis database's queues.

Setup: a fleet of --nodes nodes x 8 GPUs (40 % H100, 60 % A100), --orgs orgs of 5
users over the three tiers, and --queued queued jobs (1-8 GPUs, submitted over the last
hour), inserted in bulk. Then: a first tick, which fills the empty fleet (thousands of
placements), and a second tick on the full fleet (the steady state: few or no
decisions), each timed as snapshot / policy / apply. The queue sizes are measured in
turn, baseline first, so the ratio shows how the read grows with the queue.

`--history N` gives every size an hour of finished work first: N succeeded jobs whose
attempts ended over the last hour, which the tick reads for its runtime ratios (the
newest 600 of them).

`--crowd N` adds a last row: N users (in orgs of 5) with one queued job each, the shape
of a free tier's sign-ups, where the queue window's per-user floor does not bound the
read and its hard cap (`queue_window_max_jobs`) does.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("GANTRY_LOG_LEVEL", "WARNING")

import django  # noqa: E402
from _common import add_cpus_argument, begin_run, usable_cpus  # noqa: E402

BENCH_DB = f"test_gantry_bench_dispatch_{os.getpid()}"
TIERS = (("enterprise", 0.1), ("paid", 0.3), ("free", 0.6))


def setup_django() -> None:
    if "DATABASE_URL" not in os.environ:
        sys.exit(
            "Set DATABASE_URL and REDIS_URL, or run: "
            "python scripts/stack.py run -- python bench/dispatch.py"
        )
    django.setup()
    from django.db import connection

    connection.settings_dict["TEST"]["NAME"] = BENCH_DB


def build_fleet(nodes: int) -> None:
    from apps.fleet.fleet_file import parse_fleet
    from apps.fleet.services import load_fleet

    document = {
        "gpu_types": {
            "H100": {"memory_gb": 80, "price_per_gpu_hour": 4_000_000},
            "A100": {"memory_gb": 40, "price_per_gpu_hour": 2_000_000},
        },
        "nodes": [
            {"name": f"n{i:05d}", "gpus": [{"type": "H100" if i < nodes * 0.4 else "A100"}] * 8}
            for i in range(nodes)
        ],
    }
    load_fleet(parse_fleet(document))


def build_tenants(orgs: int) -> list[tuple[str, str, str, list[str]]]:
    """(tier, org id, project id, [user ids]) of `orgs` orgs of 5 users each."""
    from apps.accounts.models import Org, Project, User

    tenants = []
    for n in range(orgs):
        tier = TIERS[0][0] if n < orgs * 0.1 else TIERS[1][0] if n < orgs * 0.4 else "free"
        org = Org.objects.create(name=f"bench-{n}", tier=tier)
        project = Project.objects.create(org=org, name="bench")
        users = User.objects.bulk_create(User(org=org, name=f"u{u}") for u in range(5))
        tenants.append((tier, str(org.pk), str(project.pk), [str(u.pk) for u in users]))
    return tenants


def build_crowd(users: int) -> list[tuple[str, str, str, list[str]]]:
    """`users` free-tier users in orgs of 5, in bulk (tenants as build_tenants has them)."""
    from apps.accounts.models import Org, Project, User

    orgs = Org.objects.bulk_create(
        Org(name=f"crowd-{n}", tier="free") for n in range(-(-users // 5))
    )
    projects = Project.objects.bulk_create(Project(org=org, name="crowd") for org in orgs)
    members = User.objects.bulk_create(User(org=orgs[n // 5], name=f"c{n}") for n in range(users))
    return [
        ("free", str(org.pk), str(project.pk), [str(u.pk) for u in members[5 * i : 5 * i + 5]])
        for i, (org, project) in enumerate(zip(orgs, projects, strict=True))
    ]


def queue_one_each(tenants, seed: int) -> int:
    """One queued job for every user of `tenants`; returns how many."""
    rows = [(tier, org, project, [user]) for tier, org, project, users in tenants for user in users]
    queue_jobs(rows, len(rows), seed, in_turn=True)
    return len(rows)


def queue_jobs(tenants, count: int, seed: int, *, in_turn: bool = False) -> None:
    """`count` queued jobs, in one INSERT ... SELECT per batch (the ORM would take minutes),
    each for a tenant drawn at random, or (`in_turn`) for each tenant in turn."""
    from django.db import connection

    rng = random.Random(seed)
    rows = []
    for n in range(count):
        tier, org, project, users = tenants[n % len(tenants)] if in_turn else rng.choice(tenants)
        gpus = rng.choice((1, 1, 1, 2, 2, 4, 8))
        types = rng.choice(("{H100,A100}", "{A100}", "{H100}", "{}"))
        age = rng.uniform(0, 3600)
        rows.append((str(uuid.uuid4()), org, project, rng.choice(users), tier, gpus, types, age))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), 5000):
            batch = rows[start : start + 5000]
            cursor.execute(
                """
                INSERT INTO jobs_job (id, org_id, project_id, user_id, tier, status, params,
                    gpu_count, gpu_types, min_gpu_memory_gb, max_runtime_s, preemptible,
                    webhook_url, fingerprint, request_digest, progress, attempt_count,
                    preemption_count, max_attempts, queued_at, checkpoint_ref, gpu_type,
                    cancel_requested, error_code, error_message, result_path, created_at)
                SELECT r.id::uuid, r.org::uuid, r.project::uuid, r.usr::uuid, r.tier, 'queued',
                       '{}'::jsonb, r.gpus, r.types::varchar[], 0, 1800, true, '',
                       md5(r.id), '', 0, 0, 0, 3, now() - r.age * interval '1 second',
                       '', '', false, '', '', '', now() - r.age * interval '1 second'
                  FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                              %s::int[], %s::text[], %s::float8[])
                       AS r(id, org, project, usr, tier, gpus, types, age)
                """,
                [list(column) for column in zip(*batch, strict=True)],
            )
        cursor.execute("ANALYZE jobs_job")


def finished_history(tenants, count: int, seed: int) -> None:
    """`count` succeeded jobs, each with one attempt that ended within the last hour
    (1-8 GPUs, ran 10 s to 30 min of an 1,800 s max runtime), in bulk like queue_jobs."""
    from django.db import connection

    if not count:
        return
    rng = random.Random(seed + 1)
    rows = []
    for _ in range(count):
        tier, org, project, users = rng.choice(tenants)
        ran = rng.uniform(10, 1800)
        ended = rng.uniform(0, 3600)
        rows.append((str(uuid.uuid4()), org, project, rng.choice(users), tier, ran, ended))
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM scheduler_node ORDER BY id LIMIT 1")
        node = cursor.fetchone()[0]
        for start in range(0, len(rows), 5000):
            batch = rows[start : start + 5000]
            columns = [list(column) for column in zip(*batch, strict=True)]
            cursor.execute(
                """
                INSERT INTO jobs_job (id, org_id, project_id, user_id, tier, status, params,
                    gpu_count, gpu_types, min_gpu_memory_gb, max_runtime_s, preemptible,
                    webhook_url, fingerprint, request_digest, progress, attempt_count,
                    preemption_count, max_attempts, queued_at, checkpoint_ref, gpu_type,
                    cancel_requested, error_code, error_message, result_path, created_at,
                    finished_at)
                SELECT r.id::uuid, r.org::uuid, r.project::uuid, r.usr::uuid, r.tier,
                       'succeeded', '{}'::jsonb, 1, '{}'::varchar[], 0, 1800, true, '',
                       md5(r.id), '', 1, 1, 0, 3,
                       now() - (r.ended + r.ran + 5) * interval '1 second', '', 'H100',
                       false, '', '', '',
                       now() - (r.ended + r.ran + 5) * interval '1 second',
                       now() - r.ended * interval '1 second'
                  FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
                              %s::float8[], %s::float8[])
                       AS r(id, org, project, usr, tier, ran, ended)
                """,
                columns,
            )
            cursor.execute(
                """
                INSERT INTO jobs_attempt (id, job_id, org_id, number, node_id, gpu_type,
                    price_per_gpu_hour, gpu_indices, devices, fencing_token, state,
                    lease_expires_at, worker, exit_class, error_message, checkpoint_ref,
                    gpu_ms, charged, created_at, started_at, finished_at)
                SELECT gen_random_uuid(), r.id::uuid, r.org::uuid, 1, %s, 'H100', 0, '{0}',
                       '0', nextval('scheduler_fencing_token_seq'), 'finished', now(),
                       'bench@history', 'succeeded', '',
                       '', (r.ran * 1000)::bigint, 0,
                       now() - (r.ended + r.ran + 1) * interval '1 second',
                       now() - (r.ended + r.ran) * interval '1 second',
                       now() - r.ended * interval '1 second'
                  FROM unnest(%s::text[], %s::text[], %s::float8[], %s::float8[])
                       WITH ORDINALITY AS r(id, org, ran, ended, n)
                """,
                [node, columns[0], columns[1], columns[5], columns[6]],
            )
        cursor.execute("ANALYZE jobs_job")
        cursor.execute("ANALYZE jobs_attempt")


def time_tick(*, apply: bool = True) -> dict:
    """One tick, its parts timed as the dispatcher runs them (without `apply`: the
    decisions are made but not applied). The tick explains the queue (every
    GANTRY_QUEUE_STATE_INTERVAL_S): timed as `explain` (the policy's explanations and
    estimates beyond the decisions) and `publish` (writing them to Redis)."""
    from apps.scheduler.policy import schedule, schedule_round
    from apps.scheduler.services.dispatch import (
        apply_decisions,
        drop_stale_claims,
        publish_queue_states,
    )
    from apps.scheduler.services.snapshot import build_snapshot

    started = time.perf_counter()
    drop_stale_claims()
    snapshot = build_snapshot()
    read = time.perf_counter()
    decisions = schedule(snapshot.cluster)
    decided = time.perf_counter()
    waiting = schedule_round(snapshot.cluster, explain=True).waiting
    explained = time.perf_counter()
    outcomes = apply_decisions(decisions, tick=uuid.uuid4()) if apply else []
    applied = time.perf_counter()
    publish_queue_states(waiting, snapshot.cluster)
    published = time.perf_counter()
    return {
        "listed": snapshot.queued_loaded,
        "decisions": len(decisions),
        "applied": sum(1 for o in outcomes if o.outcome == "applied"),
        "skipped": Counter(o.skip_reason for o in outcomes if o.outcome != "applied"),
        "read": read - started,
        "policy": decided - read,
        # the explaining round minus a deciding one: what explaining adds
        "explain": max(0.0, (explained - decided) - (decided - read)),
        "apply": applied - explained,
        "publish": published - applied,
        "total": (decided - started)
        + (applied - explained)
        + (published - applied)
        + max(0.0, (explained - decided) - (decided - read)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--orgs", type=int, default=1000)
    parser.add_argument("--queued", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--history",
        type=int,
        default=20_000,
        help="succeeded jobs whose attempts ended over the last hour, before each size",
    )
    parser.add_argument(
        "--crowd",
        type=int,
        default=0,
        help="then a tick with this many users queueing one job each (0: none)",
    )
    parser.add_argument(
        "--no-apply",
        action="store_true",
        help="read and decide only (one tick per size; applying a first tick on a large "
        "empty fleet takes minutes)",
    )
    add_cpus_argument(parser)
    args = parser.parse_args(argv)
    begin_run(
        "bench/dispatch.py",
        args.cpus,
        started_here="none (the tick runs in this process)",
        database_url=os.environ.get("DATABASE_URL"),
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    )

    setup_django()
    from django.db import connection

    from apps.jobs.models import Attempt, GpuAssignment, Job, JobEvent
    from apps.scheduler.models import DispatchDecision, NodeClaim

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0]
        build_fleet(args.nodes)
        tenants = build_tenants(args.orgs)
        print(
            f"dispatch bench: PostgreSQL {version}, {args.nodes} nodes x 8 GPUs, "
            f"{args.orgs} orgs x 5 users; {args.history:,} attempts ended in the last hour; "
            f"{usable_cpus()} CPUs usable; load average "
            f"{os.getloadavg()[0]:.1f}",
            flush=True,
        )
        print(
            f"{'queued':>8} {'tick':>6} {'listed':>7} {'decisions':>9} {'applied':>7} "
            f"{'read ms':>8} {'policy ms':>9} {'explain ms':>10} {'apply ms':>9} "
            f"{'publish ms':>10} {'total ms':>9}"
        )
        reads = {}
        # A fresh queue and an empty fleet for each size (TRUNCATE: the event log
        # refuses DELETE, and allows TRUNCATE only in test_* databases like this one).
        tables = [m._meta.db_table for m in (JobEvent, GpuAssignment, Attempt, Job)]
        tables += [DispatchDecision._meta.db_table, NodeClaim._meta.db_table]
        sizes = [(size, "") for size in sorted(args.queued)]
        if args.crowd:
            sizes.append((args.crowd, "crowd"))
        for size, shape in sizes:
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
            finished_history(tenants, args.history, args.seed)
            if shape:
                queue_one_each(build_crowd(size), args.seed)
            else:
                queue_jobs(tenants, size, args.seed)
            for tick in ("decide",) if args.no_apply else ("fill", "steady"):
                t = time_tick(apply=not args.no_apply)
                if tick != "fill" and not shape:
                    reads[size] = t["read"]
                print(
                    f"{size:>8,} {shape or tick:>6} {t['listed']:>7,} {t['decisions']:>9,} "
                    f"{t['applied']:>7,} {t['read'] * 1e3:>8.0f} {t['policy'] * 1e3:>9.0f} "
                    f"{t['explain'] * 1e3:>10.0f} {t['apply'] * 1e3:>9.0f} "
                    f"{t['publish'] * 1e3:>10.0f} {t['total'] * 1e3:>9.0f}",
                    flush=True,
                )
                for why, count in t["skipped"].most_common(3):  # a skip is not a placement
                    print(f"{'':>8} skipped {count:,}: {why}", flush=True)
        if len(reads) > 1:
            small, large = min(reads), max(reads)
            print(
                f"snapshot read {small:,} -> {large:,} queued (baseline: the "
                f"{small:,} row): x{reads[large] / reads[small]:.2f} for x{large / small:.0f} jobs"
            )
        if args.crowd:
            print(
                f"crowd: {args.crowd:,} users with one job each; the window lists at most "
                f"queue_window_max_jobs of them"
            )
        return 0
    finally:
        connection.close()
        connection.creation.destroy_test_db(old_name, verbosity=0)
        drop_run_messages(args.nodes)


def drop_run_messages(nodes: int) -> None:
    """The run messages the ticks published to the bench nodes' queues."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    names = [f"node.n{i:05d}" for i in range(nodes)]
    for start in range(0, len(names), 500):
        client.delete(*names[start : start + 500])
    return 0


if __name__ == "__main__":
    sys.exit(main())
