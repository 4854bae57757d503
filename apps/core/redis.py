"""The one Redis client of a process, for hot, rebuildable state and signals.

Short timeouts and no retries: every user of Redis here (admission's token buckets and
queue-depth cache, the dispatcher wake-up, the readiness probe) has a fallback when it is
down, and must not stall a request waiting for it.
"""

from __future__ import annotations

import logging
import threading

import redis
from django.conf import settings
from django.db import transaction
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

_client: redis.Redis | None = None
_lock = threading.Lock()


def redis_client() -> redis.Redis:
    """This process's Redis client (thread-safe; connections are pooled)."""
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = redis.Redis.from_url(
                    settings.REDIS_URL,
                    socket_timeout=0.5,
                    socket_connect_timeout=0.5,
                    retry=Retry(NoBackoff(), 0),
                )
    return _client


def reset_redis_client() -> None:
    """Forget the client (after a fork, or when tests point REDIS_URL elsewhere)."""
    global _client
    with _lock:
        _client = None


def publish_on_commit(channel: str, message: bytes = b"1") -> None:
    """Publish `message` on the pub/sub `channel` once the current transaction commits
    (at once outside one). For nudges ("look again"): best effort, a Redis that is down
    never fails the change, and listeners must re-read the truth on their own timer."""

    def publish() -> None:
        try:
            redis_client().publish(channel, message)
        except (redis.RedisError, OSError):
            logger.debug("nudge on %s not published", channel, exc_info=True)

    transaction.on_commit(publish, robust=True)
