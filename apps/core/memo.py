"""Per-process memo caches: short memories of looked-up rows on the hot paths."""

from __future__ import annotations

import threading
import time

from django.conf import settings


class ProcessMemo:
    """A short per-process memory of looked-up rows (API keys, projects) or of what a
    hot path learned (which statement an org needs): submission is the hot path, and
    these lookups were a sizeable share of it. A change reaches other processes within
    `ttl_s` (default GANTRY_API_KEY_CACHE_S); in the changing process at once (forget)."""

    def __init__(self, ttl_s: float | None = None):
        self._ttl_s = ttl_s
        self._entries: dict = {}
        self._lock = threading.Lock()

    def get(self, key):
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key, value) -> None:
        ttl = settings.GANTRY_API_KEY_CACHE_S if self._ttl_s is None else self._ttl_s
        if ttl <= 0:
            return
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + ttl, value)

    def forget(self, key) -> None:
        with self._lock:
            self._entries.pop(key, None)
