"""Admission control: per-org and per-tier rate limits, overload shedding, queue quotas.

Rate limits are token buckets in Redis, checked and drawn by one Lua script so that
concurrent API processes never overspend a bucket (Redis's own clock, one clock for all
processes). A submission draws one token from its org's bucket and, when its tier has a
tier-wide bucket (settings.GANTRY_TIER_AGGREGATE_RATE, by default only the free tier),
from that too; it is refused unless both have a token, and then neither is drawn.

Under sustained overload the free tier is shed first: its tier-wide bucket caps the rate
of all free submissions together, and once the platform-wide queue passes
GANTRY_SHED_FREE_QUEUE_DEPTH free submissions get 429 while paid and enterprise
submissions are admitted as before.

Queue quotas are PostgreSQL's: near its max_queued an org's queued jobs are counted
under a lock. Far from it the count is skipped on the strength of an estimate in Redis
(QUEUED_ESTIMATE_KEY: PostgreSQL's count at most once a second per org, plus the
submissions admitted since), read in the rate limit's round trip.

Redis holds only rebuildable state: if it is unreachable, submissions are admitted
(fail open) and the failure is logged; quotas (counted every time while Redis is
away), credits and budgets are still enforced by PostgreSQL.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections

from apps.accounts.models import Org, Tier
from apps.core import locks
from apps.core.errors import GantryError, RateLimited
from apps.core.redis import redis_client
from apps.core.sql import execute
from apps.jobs import metrics, selectors
from apps.jobs.models import JobStatus

logger = logging.getLogger(__name__)

# KEYS: n bucket keys, then the org's queued-jobs estimate (QUEUED_ESTIMATE_KEY). ARGV:
# cost, n, then rate_per_s and burst for each bucket in order. Answers {0, estimate}
# when every bucket had `cost` tokens (and draws them; the estimate, if there is one,
# counts them too, else false), else {the milliseconds until the emptiest bucket will
# have them, false} (and draws and counts nothing).
RATE_LIMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cost = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local tokens = {}
local wait = 0
for i = 1, n do
  local rate = tonumber(ARGV[2 * i + 1])
  local burst = tonumber(ARGV[2 * i + 2])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local level = tonumber(state[1])
  local ts = tonumber(state[2])
  if level == nil or ts == nil then
    level = burst
    ts = now
  end
  level = math.min(burst, level + math.max(0, now - ts) * rate)
  tokens[i] = level
  if level < cost then
    wait = math.max(wait, (cost - level) / rate)
  end
end
if wait > 0 then
  return {math.ceil(wait * 1000), false}
end
for i = 1, n do
  local rate = tonumber(ARGV[2 * i + 1])
  local burst = tonumber(ARGV[2 * i + 2])
  redis.call('HSET', KEYS[i], 'tokens', tokens[i] - cost, 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil(burst / rate * 1000) + 1000)
end
local estimate = false
if redis.call('EXISTS', KEYS[n + 1]) == 1 then
  estimate = redis.call('INCRBY', KEYS[n + 1], cost)
end
return {0, estimate}
"""

QUEUE_DEPTH_KEY = "gantry:admission:queue_depth"
QUEUE_DEPTH_TTL_MS = 1000

# An org's queued jobs as PostgreSQL last counted them (at most once a second per org),
# plus every submission admitted since: an estimate that errs high (jobs that left the
# queue since, submissions refused after admission) and low only by jobs requeued within
# that second, which the quota's lock margin covers. Far from the quota, a submission
# trusts it and counts nothing: counting costs PostgreSQL CPU in proportion to the queue.
QUEUED_ESTIMATE_KEY = "gantry:admission:queued:{}"
QUEUED_ESTIMATE_TTL_MS = 1000

# While Redis is unreachable, admission skips it for this long instead of paying a
# connect timeout on every submission.
REDIS_BACKOFF_S = 5.0

_bucket_script = None
_redis_down_until = 0.0


def _rate_limit_script():
    """The token-bucket script, registered once on the process's Redis client."""
    global _bucket_script
    if _bucket_script is None:
        _bucket_script = redis_client().register_script(RATE_LIMIT_LUA)
    return _bucket_script


def _redis_available() -> bool:
    return time.monotonic() >= _redis_down_until


def _redis_failed(exc: Exception, what: str) -> None:
    global _redis_down_until
    _redis_down_until = time.monotonic() + REDIS_BACKOFF_S
    logger.warning("%s skipped for %ss (Redis unavailable): %s", what, REDIS_BACKOFF_S, exc)


@dataclass(frozen=True)
class OrgLimits:
    """The org's effective limits: its overrides, else its tier's defaults."""

    max_queued: int
    max_running: int
    rate_per_s: float
    burst: int


def org_limits(org: Org) -> OrgLimits:
    """Limits of `org` (per-org overrides on Org win over settings.GANTRY_TIER_DEFAULTS)."""
    defaults = settings.GANTRY_TIER_DEFAULTS[org.tier]
    return OrgLimits(
        max_queued=_first_set(org.max_queued_jobs, defaults["max_queued"]),
        max_running=_first_set(org.max_running_jobs, defaults["max_running"]),
        rate_per_s=float(_first_set(org.rate_per_s, defaults["rate_per_s"])),
        burst=int(_first_set(org.rate_burst, defaults["burst"])),
    )


def _first_set(value, default):
    return default if value is None else value


def org_bucket_key(org_id) -> str:
    return f"gantry:ratelimit:org:{org_id}"


def tier_bucket_key(tier: str) -> str:
    return f"gantry:ratelimit:tier:{tier}"


def check_rate(org: Org, *, cost: int = 1) -> int | None:
    """Draw `cost` submissions from the org's (and its tier's) bucket, or raise 429.

    The 429 carries Retry-After: the whole seconds until the bucket refills enough.
    Returns the org's queued-jobs estimate with these submissions counted (see
    QUEUED_ESTIMATE_KEY), from the same script, or None if there is none.
    """
    limits = org_limits(org)
    buckets = [(org_bucket_key(org.id), limits.rate_per_s, max(limits.burst, cost))]
    aggregate = settings.GANTRY_TIER_AGGREGATE_RATE.get(org.tier)
    if aggregate:
        rate, burst = float(aggregate["rate_per_s"]), max(int(aggregate["burst"]), cost)
        buckets.append((tier_bucket_key(org.tier), rate, burst))
    keys = [key for key, _, _ in buckets] + [QUEUED_ESTIMATE_KEY.format(org.id)]
    args = [cost, len(buckets)] + [value for _, rate, burst in buckets for value in (rate, burst)]
    if not _redis_available():
        return None
    try:
        wait_ms, estimate = _rate_limit_script()(keys=keys, args=args)
        wait_ms = int(wait_ms)
    except (redis.RedisError, OSError) as exc:
        _redis_failed(exc, "rate limiting")
        return None
    if wait_ms > 0:
        metrics.count_refusal(tier=org.tier, reason="rate_limited")
        raise RateLimited(
            f"Too many submissions; retry in {math.ceil(wait_ms / 1000)} s.",
            retry_after=max(1, math.ceil(wait_ms / 1000)),
        )
    return None if estimate is None else int(estimate)


def remember_queued(org_id, queued: int) -> None:
    """Start the org's queued-jobs estimate from an exact count (`queued`, this
    submission included), unless another submission just did."""
    if not _redis_available():
        return
    try:
        redis_client().set(
            QUEUED_ESTIMATE_KEY.format(org_id), queued, px=QUEUED_ESTIMATE_TTL_MS, nx=True
        )
    except (redis.RedisError, OSError) as exc:
        _redis_failed(exc, "queued estimate")


def far_below_quota(org: Org, estimate: int | None) -> bool:
    """Whether the org's queued-jobs estimate is so far below its quota (more than the
    lock margin) that the submission need not count its queue."""
    if estimate is None:
        return False
    return estimate + settings.GANTRY_QUOTA_LOCK_MARGIN < org_limits(org).max_queued


def check_overload(org: Org) -> None:
    """Shed the free tier (429) while the platform-wide queue is deeper than the threshold.

    Paid and enterprise submissions never pay for this check and are never refused by it.
    """
    if org.tier != Tier.FREE:
        return
    if queue_depth() > settings.GANTRY_SHED_FREE_QUEUE_DEPTH:
        metrics.count_refusal(tier=org.tier, reason="overloaded")
        raise RateLimited(
            "The platform is busy; free-tier submissions are paused. Retry later.",
            code="overloaded",
            retry_after=settings.GANTRY_SHED_RETRY_AFTER_S,
        )


def queue_depth() -> int:
    """Platform-wide queued jobs, cached in Redis for a second (one count per second)."""
    client = redis_client() if _redis_available() else None
    if client is not None:
        try:
            cached = client.get(QUEUE_DEPTH_KEY)
            if cached is not None:
                return int(cached)
        except (redis.RedisError, OSError) as exc:
            _redis_failed(exc, "queue depth cache")
            client = None
    depth = selectors.platform_queue_depth()
    if client is not None:
        with contextlib.suppress(redis.RedisError, OSError):
            client.set(QUEUE_DEPTH_KEY, depth, px=QUEUE_DEPTH_TTL_MS)
    return depth


def admit(org: Org) -> int | None:
    """The Redis half of admission, in the documented order: rate limit, then overload.
    Returns the org's queued-jobs estimate (check_rate), for the quota check."""
    estimate = check_rate(org)
    check_overload(org)
    return estimate


def check_queue_quota(org: Org, *, queued: int | None = None) -> None:
    """Refuse (429) a submission that would take the org past its max_queued jobs.

    Call inside the submission transaction (`queued`: the org's queued jobs if the
    caller already counted them). Far below the limit the count is a plain read;
    within GANTRY_QUOTA_LOCK_MARGIN of it, the org's submissions serialise on a
    transaction-scoped advisory lock and recount, so concurrent submissions cannot
    overshoot the limit. Counts stop at the limit: a full queue costs no more to refuse
    than a short one.
    """
    limit = org_limits(org).max_queued
    if queued is None:
        queued = selectors.queued_count(org.id, up_to=limit)
    if queued + settings.GANTRY_QUOTA_LOCK_MARGIN >= limit:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {locks.xact_lock_sql('%s')}", [f"quota|{org.id}"])
        queued = selectors.queued_count(org.id, up_to=limit)
    if queued >= limit:
        metrics.count_refusal(tier=org.tier, reason="quota_exceeded")
        raise RateLimited(
            f"The org's queue is full: it has its limit of {limit} queued jobs or more.",
            code="quota_exceeded",
            retry_after=settings.GANTRY_QUOTA_RETRY_AFTER_S,
        )


class Quarantined(GantryError):
    status_code = 422
    code = "quarantined"


def quarantine_error() -> Quarantined:
    return Quarantined(
        "params: these params and resources are quarantined: they crashed or hung on "
        "several nodes. Change them, or ask an operator to clear the quarantine.",
        field="params",
    )


@dataclass(frozen=True)
class AdmissionSnapshot:
    existing_job_id: uuid.UUID | None
    quarantined: bool
    queued: int


# The submission hot path reads what admission needs in one round trip (after the
# idempotency lock, so a job committed by the lock's previous holder is visible).
_LOCK_SQL = f"SELECT {locks.xact_lock_sql('%(lock)s')}"
_SNAPSHOT_SQL = """
SELECT
    (SELECT id FROM jobs_job WHERE org_id = %(org)s AND idempotency_key = %(key)s),
    EXISTS (SELECT 1 FROM jobs_quarantinedfingerprint WHERE fingerprint = %(fp)s),
    (SELECT count(*) FROM (
        SELECT FROM jobs_job WHERE org_id = %(org)s AND status = %(queued)s LIMIT %(up_to)s
    ) AS queued)
"""


def lock_and_read(org_id, key: str, fingerprint: str, *, up_to: int) -> AdmissionSnapshot:
    """Take the (org, Idempotency-Key) lock for this transaction, then read the snapshot.

    The org's queued jobs are counted up to `up_to` (its queue quota): what the quota
    check needs, at a cost that does not grow with a long queue."""
    # Two prepared statements, one round trip (a pipeline): in READ COMMITTED each
    # statement takes its own snapshot, so the read runs after the lock is granted and
    # sees what the lock's previous holder committed.
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    with db.connection.pipeline():
        execute(db.connection, _LOCK_SQL, {"lock": f"job-submit|{org_id}|{key}"})
        cursor = execute(
            db.connection,
            _SNAPSHOT_SQL,
            {
                "org": org_id,
                "key": key,
                "fp": fingerprint,
                "queued": JobStatus.QUEUED.value,
                "up_to": up_to,
            },
        )
    existing, quarantined, queued = cursor.fetchone()
    return AdmissionSnapshot(existing, quarantined, queued)
