"""Django's PostgreSQL backend, with the per-request health check only after idleness.

CONN_HEALTH_CHECKS pings a reused connection (SELECT 1, a round trip) at the start of
every request: on the submission hot path that was a round trip in five. This backend
skips the ping when the connection already served a request within the last
HEALTH_CHECK_AFTER_IDLE_S. Connections break mostly while idle (a server restart, an
idle timeout of a proxy or firewall), and those are still pinged and replaced before
use. One that breaks while in steady use fails the request that finds it broken, and is
closed at that request's end as Django does without health checks: a query error
through Django marks it for a usability check, and an atomic block whose rollback fails
drops it (tests/api/test_db_backend.py).
"""

from __future__ import annotations

import time

from django.db.backends.postgresql import base

HEALTH_CHECK_AFTER_IDLE_S = 5.0


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_request_use = float("-inf")  # time.monotonic() of a request's first use

    def connect(self):
        super().connect()
        self.last_request_use = time.monotonic()

    def close_if_health_check_failed(self):
        if self.connection is not None and self.health_check_enabled and not self.health_check_done:
            # The first use in this request (the flag is reset at every request start).
            now = time.monotonic()
            idle = now - self.last_request_use
            self.last_request_use = now
            if idle < HEALTH_CHECK_AFTER_IDLE_S:
                self.health_check_done = True
                return
        super().close_if_health_check_failed()
