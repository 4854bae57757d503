"""The one Redis client of a process, for hot, rebuildable state and signals.

Short timeouts and no retries: every user of Redis here (admission's token buckets and
queue-depth cache, the dispatcher wake-up, the readiness probe) has a fallback when it is
down, and must not stall a request waiting for it.
"""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

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
