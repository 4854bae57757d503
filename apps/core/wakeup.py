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
# Many submissions in a burst need one early tick, not one each.
DEBOUNCE_KEY = "gantry:dispatch:wakeup"
DEBOUNCE_MS = 200

_last_sent = -DEBOUNCE_MS  # time.monotonic() in ms of this process's last wake-up


def wake_dispatcher() -> None:
    """Ask for a dispatch tick once the current transaction commits (debounced).

    Best effort: if Redis is down the periodic tick still comes, so nothing is lost.
    """

    def publish():
        global _last_sent
        now = time.monotonic() * 1000
        if now - _last_sent < DEBOUNCE_MS:
            return  # this process asked within the window: no Redis round trip either
        _last_sent = now
        try:
            if redis_client().set(DEBOUNCE_KEY, 1, nx=True, px=DEBOUNCE_MS):
                current_app.send_task(DISPATCH_TASK, queue="control", expires=5)
        except (redis.RedisError, OSError) as exc:
            logger.warning("dispatcher wake-up not sent: %s", exc)

    transaction.on_commit(publish)
