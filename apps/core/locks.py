"""PostgreSQL advisory locks: the one place that takes them.

A lock is named by a string (hashed in SQL with `hashtextextended`) or, for a lock that
other tools must be able to take by number, by a bigint. Two kinds exist:

- transaction-scoped (`xact_lock`, `xact_lock_sql`): waits, and is released by COMMIT or
  ROLLBACK; used to serialise writers of one thing (an idempotency key, an org's quota,
  an org's budgets);
- session-scoped and never waiting (`try_session_lock`): the singleton periodic work
  (the dispatcher, the reconciler, the folds); a crashed process releases it when its
  connection closes.

The platform's lock order (docs/architecture.md): advisory locks of an org's submission
and quota first, then job rows, then ledger rows, then the budget advisory lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import DatabaseError, connection


def key_sql(key_expression: str, *, hashed: bool = True) -> str:
    """The SQL for a lock key: a text expression hashed to a bigint, or a bigint as is."""
    return f"hashtextextended({key_expression}, 0)" if hashed else key_expression


def xact_lock_sql(key_expression: str, *, shared: bool = False) -> str:
    """A call taking a transaction-scoped lock on a text key, to embed in a statement
    (the hot paths take their lock in the same round trip as their work)."""
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    return f"{function}({key_sql(key_expression)})"


def xact_lock(name: str, *, shared: bool = False, using=None) -> None:
    """Wait for the transaction-scoped lock `name`; held until the transaction ends."""
    with (using or connection).cursor() as cursor:
        cursor.execute(f"SELECT {xact_lock_sql('%s', shared=shared)}", [name])


@contextlib.contextmanager
def try_session_lock(name: str | int) -> Iterator[bool]:
    """Yield True while holding the session lock `name`, False (at once) if another
    session holds it. Session-level, so it spans the several transactions of a batch."""
    key = key_sql("%s", hashed=isinstance(name, str))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_try_advisory_lock({key})", [name])
        acquired = cursor.fetchone()[0]
    try:
        yield acquired
    finally:
        if acquired:
            try:
                with connection.cursor() as cursor:
                    cursor.execute(f"SELECT pg_advisory_unlock({key})", [name])
            except DatabaseError:
                # Ending the session is what releases a session-level lock for sure.
                connection.close()
