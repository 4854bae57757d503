"""PostgreSQL advisory locks for the periodic tasks, keyed by a name hashed in SQL."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connection


@contextlib.contextmanager
def try_session_lock(name: str) -> Iterator[bool]:
    """Yield True while holding the lock, False (at once) if another session holds it.

    Session-level, so it spans the several transactions of a batch job; a crashed
    process releases it when its connection closes.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", [name])
        acquired = cursor.fetchone()[0]
    try:
        yield acquired
    finally:
        if acquired:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [name])
