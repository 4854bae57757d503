"""Wake the dispatcher early (on submit and finish) instead of waiting for the next tick."""

from __future__ import annotations

import logging
import time

import redis
from celery import current_app
from django.db import transaction

from apps.core.redis import redis_client

logger = logging.getLogger(__name__)

DISPATCH_TASK = "gantry.scheduler.dispatch_tick"
# Many commits in a burst need a few early ticks, not one each. A wake-up after a quiet
# window is sent at once and opens a window of DEBOUNCE_MS (WINDOW_KEY, of that expiry);
# the commits within a window share one wake-up sent at its end (TRAILING_KEY lives until
# then), which opens the next window. So a tick starts within DEBOUNCE_MS of every commit
# that asked, and at most one per window is sent, platform-wide.
WINDOW_KEY = "gantry:dispatch:wakeup"
TRAILING_KEY = "gantry:dispatch:wakeup:trailing"
DEBOUNCE_MS = 100

# Atomically: {0, 0} send now; {1, ms} send in ms (the window's end); {2, ms} one is
# queued for ms from now already. A window key without an expiry (PTTL -1: set by hand)
# would silence wake-ups for good: it is reset as a fresh window.
_DEBOUNCE_SCRIPT = """
if redis.call('SET', KEYS[1], 1, 'NX', 'PX', ARGV[1]) then return {0, 0} end
local left = redis.call('PTTL', KEYS[1])
if left <= 0 then
    redis.call('SET', KEYS[1], 1, 'PX', ARGV[1])
    return {0, 0}
end
if redis.call('SET', KEYS[2], 1, 'NX', 'PX', left) then
    redis.call('PEXPIRE', KEYS[1], left + tonumber(ARGV[1]))
    return {1, left}
end
return {2, redis.call('PTTL', KEYS[2])}
"""

# A tick that finds another one running asks it, through this key, for one more round
# when it ends: the commit that sent this tick may have come after the running one read
# its snapshot, and would otherwise wait for the next wake-up or the periodic tick.
RERUN_KEY = "gantry:dispatch:rerun"
RERUN_TTL_S = 60  # a request nobody takes (its tick crashed) lapses; the periodic tick remains

# time.monotonic() in ms until which a queued wake-up is known to come after any commit
# of this process: until then, no Redis round trip at all.
_covered_until = 0.0
# Less than what Redis says is left, for the two clocks (Redis's expiry, Celery's ETA).
_CLOCK_MARGIN_MS = 10


def wake_dispatcher() -> None:
    """Ask for a dispatch tick once the current transaction commits (debounced).

    Guarantee: a tick is sent within DEBOUNCE_MS of every commit that asked (at once
    after a quiet window), so a job submitted or GPUs freed just after a wake-up do not
    wait for the periodic tick; the platform sends at most one per DEBOUNCE_MS. Best
    effort: if Redis is down the periodic tick still comes, so nothing is lost.
    """
    transaction.on_commit(_publish)


def ask_for_another_round() -> None:
    """Ask the tick running now for another round once it ends (best effort: if Redis
    is down, the periodic tick still comes)."""
    try:
        redis_client().set(RERUN_KEY, 1, ex=RERUN_TTL_S)
    except (redis.RedisError, OSError) as exc:
        logger.warning("dispatcher rerun not asked: %s", exc)


def another_round_asked() -> bool:
    """Whether a tick asked for another round since the last call (and clear the ask)."""
    try:
        return redis_client().getdel(RERUN_KEY) is not None
    except (redis.RedisError, OSError) as exc:
        logger.warning("dispatcher rerun not read: %s", exc)
        return False


def wake_dispatcher_now() -> None:
    """wake_dispatcher outside a transaction: the tick is sent at once, or within the
    current window (debounced as every wake-up)."""
    _publish()


def _publish() -> None:
    global _covered_until
    now = time.monotonic() * 1000
    if now < _covered_until:
        return  # a queued wake-up runs after this commit: it sees it
    try:
        kind, ms = redis_client().eval(_DEBOUNCE_SCRIPT, 2, WINDOW_KEY, TRAILING_KEY, DEBOUNCE_MS)
        if kind == 0:
            current_app.send_task(DISPATCH_TASK, queue="control", expires=5)
            return
        if kind == 1:
            current_app.send_task(DISPATCH_TASK, queue="control", countdown=ms / 1000, expires=5)
        _covered_until = now + ms - _CLOCK_MARGIN_MS
    except (redis.RedisError, OSError) as exc:
        logger.warning("dispatcher wake-up not sent: %s", exc)
