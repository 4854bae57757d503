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
# Many submissions in a burst need one early tick, not one each: at most one wake-up is
# sent at once per DEBOUNCE_MS (this key, set with that expiry), and the commits within
# that time share one more, sent DEBOUNCE_MS later (the trailing key, set while it waits).
DEBOUNCE_KEY = "gantry:dispatch:wakeup"
TRAILING_KEY = "gantry:dispatch:wakeup:trailing"
DEBOUNCE_MS = 200

# time.monotonic() in ms until which a queued trailing wake-up is known to come after any
# commit of this process: until then, no Redis round trip at all.
_covered_until = 0.0


def wake_dispatcher() -> None:
    """Ask for a dispatch tick once the current transaction commits (debounced).

    Guarantee: a tick starts within about DEBOUNCE_MS of every commit that asked, so a
    GPU freed or a job submitted just after a wake-up does not wait for the periodic
    tick; and the whole platform sends at most two wake-ups per DEBOUNCE_MS. Best effort:
    if Redis is down the periodic tick still comes, so nothing is lost.
    """
    transaction.on_commit(_publish)


def _publish() -> None:
    global _covered_until
    now = time.monotonic() * 1000
    if now < _covered_until:
        return  # a trailing wake-up runs after this commit: it sees it
    try:
        client = redis_client()
        if client.set(DEBOUNCE_KEY, 1, nx=True, px=DEBOUNCE_MS):
            current_app.send_task(DISPATCH_TASK, queue="control", expires=5)
            return
        with client.pipeline(transaction=False) as pipe:
            pipe.set(TRAILING_KEY, 1, nx=True, px=DEBOUNCE_MS)
            pipe.pttl(TRAILING_KEY)
            queued, left_ms = pipe.execute()
        if queued:
            current_app.send_task(
                DISPATCH_TASK, queue="control", countdown=DEBOUNCE_MS / 1000, expires=5
            )
            _covered_until = now + DEBOUNCE_MS
        elif left_ms > _CLOCK_MARGIN_MS:
            # Another process queued it: it runs about when its key expires, later than
            # this commit (less a margin for the two clocks).
            _covered_until = now + left_ms - _CLOCK_MARGIN_MS
    except (redis.RedisError, OSError) as exc:
        logger.warning("dispatcher wake-up not sent: %s", exc)


_CLOCK_MARGIN_MS = 10
