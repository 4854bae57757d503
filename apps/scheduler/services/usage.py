"""Decayed GPU-seconds per tier, org and user: what fair share remembers.

Finished attempts are folded into `UsageAccount` rows once each (record_attempt_usage),
by the scheduler itself: each dispatch tick first folds the attempts that ended since
(fold_ended_attempts), so the jobs app never calls up into the scheduler;
attempts still holding GPUs are counted by the snapshot from their start time, so a
running job weighs on its owner at once and nothing is counted twice. Rows are touched
once per finished attempt, never per heartbeat (the hot path stays on per-hold rows).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from apps.core.clock import db_now
from apps.jobs.models import Attempt
from apps.scheduler.models import RecordedAttemptUsage, UsageAccount, UsageScope
from apps.scheduler.policy import decay

# Past this many half-lives a usage row is below a billionth of its value: not read.
FORGOTTEN_AFTER_HALF_LIVES = 30


def half_life_s() -> float:
    return float(settings.GANTRY_USAGE_HALF_LIFE_S)


def user_key(org_id, user_id) -> str:
    return f"{org_id}/{user_id or ''}"


def spread_factor(duration_s: float, half_life: float) -> float:
    """Decayed worth, at the end of a span, of usage spread evenly over that span.

    One GPU held for d seconds leaves h/ln2 · (1 - 2^(-d/h)) decayed GPU-seconds at its
    end, i.e. d times this factor (≤ 1; 1 for an instant)."""
    if duration_s <= 0:
        return 1.0
    x = duration_s / half_life
    return -math.expm1(-x * math.log(2)) / (x * math.log(2))


def add_gpu_usage(worths: list[tuple[str, object, object, float]]) -> None:
    """Add each (tier, org, user, decayed GPU-seconds now) to its tier's, org's and user's
    rows: every value brought forward to the database's now() and increased, in one UPSERT
    that locks its rows in one fixed order (scope, then key). Not idempotent:
    record_attempts_usage records each attempt once."""
    totals: dict[tuple[str, str], float] = {}
    for tier, org_id, user_id, worth in worths:
        if worth <= 0:
            continue
        for key in (
            (UsageScope.TIER.value, tier),
            (UsageScope.ORG.value, str(org_id)),
            (UsageScope.USER.value, user_key(org_id, user_id)),
        ):
            totals[key] = totals.get(key, 0.0) + worth
    if not totals:
        return
    rank = {UsageScope.TIER.value: 0, UsageScope.ORG.value: 1, UsageScope.USER.value: 2}
    keys = sorted(totals, key=lambda k: (rank[k[0]], k[1]))
    table = UsageAccount._meta.db_table
    with connection.cursor() as cursor:
        # S608: the table name is our own model's; every value is a bound parameter.
        cursor.execute(
            f"INSERT INTO {table} (scope, key, value, as_of) "  # noqa: S608
            "SELECT s, k, v, now() FROM unnest(%s::text[], %s::text[], %s::float8[])"
            " WITH ORDINALITY AS t(s, k, v, n) ORDER BY n "
            f"ON CONFLICT (scope, key) DO UPDATE SET "
            f"value = {table}.value * power(2.0::float8, -GREATEST(0.0::float8, "
            f"EXTRACT(EPOCH FROM now() - {table}.as_of)::float8) / %s) + EXCLUDED.value, "
            f"as_of = GREATEST({table}.as_of, now())",
            [[k[0] for k in keys], [k[1] for k in keys], [totals[k] for k in keys], half_life_s()],
        )


def record_attempt_usage(*, attempt_id) -> float | None:
    """Fold the GPU time of one attempt into its owner's usage, exactly once.

    Call it when the attempt finishes (after its row says finished). GPU time is the
    attempt's metered gpu_ms, or its wall time times its GPUs when nothing was metered. Returns
    the GPU-seconds recorded, or None if the attempt never started or was recorded
    before (a second call changes nothing).
    """
    return record_attempts_usage([attempt_id]).get(str(attempt_id))


def record_attempts_usage(attempt_ids) -> dict[str, float]:
    """Fold the GPU time of these attempts into their owners' usage, each exactly once,
    in one transaction of three statements whatever their number; returns attempt id ->
    GPU-seconds recorded for those recorded now (not those that never started, nor those
    recorded before: a second call changes nothing)."""
    rows = (
        Attempt.objects.filter(pk__in=list(attempt_ids), started_at__isnull=False)
        .order_by("pk")
        .values_list(
            "pk",
            "gpu_ms",
            "gpu_indices",
            "started_at",
            "finished_at",
            "job__tier",
            "job__org_id",
            "job__user_id",
        )
    )
    if not rows:
        return {}
    with transaction.atomic():
        now = db_now()
        found = {}
        for pk, gpu_ms, indices, started_at, finished_at, tier, org_id, user_id in rows:
            span = max(0.0, ((finished_at or now) - started_at).total_seconds())
            gpu_seconds = gpu_ms / 1000 if gpu_ms > 0 else span * len(indices)
            found[str(pk)] = (gpu_seconds, span, tier, org_id, user_id)
        table = RecordedAttemptUsage._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (attempt_id, gpu_seconds, recorded_at) "  # noqa: S608
                "SELECT a, g, now() FROM unnest(%s::uuid[], %s::float8[]) AS t(a, g) "
                "ON CONFLICT (attempt_id) DO NOTHING RETURNING attempt_id",
                [list(found), [found[a][0] for a in found]],
            )
            recorded = [str(row[0]) for row in cursor.fetchall()]
        half_life = half_life_s()
        add_gpu_usage(
            [
                (tier, org_id, user_id, gpu_seconds * spread_factor(span, half_life))
                for gpu_seconds, span, tier, org_id, user_id in (found[a] for a in recorded)
            ]
        )
    return {a: found[a][0] for a in recorded}


# How many ended attempts one tick folds at most (the rest wait for the next tick), and
# how far back a tick looks: an attempt that ended while no tick ran for longer than this
# is left out of fair share (a bounded error, in exchange for a bounded read per tick).
FOLD_BATCH = 1000
FOLD_LOOKBACK_S = 3600

_UNRECORDED_ENDED_ATTEMPTS = """
SELECT a.id FROM jobs_attempt a
 WHERE a.state = 'finished' AND a.started_at IS NOT NULL
   AND a.finished_at > statement_timestamp() - %(horizon)s * interval '1 second'
   AND NOT EXISTS (SELECT 1 FROM scheduler_recordedattemptusage r WHERE r.attempt_id = a.id)
 ORDER BY a.finished_at
 LIMIT %(limit)s
"""


def fold_ended_attempts(*, limit: int = FOLD_BATCH) -> int:
    """Fold every attempt that ended and is not yet in fair share's usage (up to `limit`,
    oldest first); returns how many were folded. Safe to run concurrently and twice: each
    attempt is recorded at most once (record_attempts_usage). Attempts that ended longer ago
    than FOLD_LOOKBACK_S are not read."""
    horizon = min(FOLD_LOOKBACK_S, FORGOTTEN_AFTER_HALF_LIVES * half_life_s())
    with connection.cursor() as cursor:
        cursor.execute(_UNRECORDED_ENDED_ATTEMPTS, {"horizon": horizon, "limit": limit})
        ended = [row[0] for row in cursor.fetchall()]
    return len(record_attempts_usage(ended))


def decayed_accounts(now: datetime) -> dict[tuple[str, str], float]:
    """Every remembered (scope, key) → decayed GPU-seconds at `now` (one query)."""
    half_life = half_life_s()
    horizon = FORGOTTEN_AFTER_HALF_LIVES * half_life
    rows = UsageAccount.objects.filter(as_of__gt=now - timedelta(seconds=horizon)).values_list(
        "scope", "key", "value", "as_of"
    )
    return {
        (scope, key): decay(value, (now - as_of).total_seconds(), half_life)
        for scope, key, value, as_of in rows
    }


def running_worth(elapsed_s: float, gpus: int, half_life: float) -> float:
    """Decayed GPU-seconds, now, of `gpus` held for the last `elapsed_s` seconds."""
    if elapsed_s <= 0:
        return 0.0
    return gpus * elapsed_s * spread_factor(elapsed_s, half_life)
