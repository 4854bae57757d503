"""PostgreSQL advisory locks: the one place that takes them.

A lock is named by a string (hashed in SQL with `hashtextextended`) or, for a lock that
other tools must be able to take by number, by a bigint. Two kinds exist:

- transaction-scoped (`xact_lock`, `xact_lock_sql`): waits, and is released by COMMIT or
  ROLLBACK; used to serialise writers of one thing (an idempotency key, an org's quota,
  an org's budgets);
- session-scoped and never waiting (`try_session_lock`): the singleton periodic work
  (the dispatcher, the reconciler, the folds); a crashed process releases it when its
  connection closes. `LeaderLock` keeps one across calls (the beat's leadership).

A session lock's holder may also be cut off from the database (its host's link lost):
the server sees no close, only silence, and TCP alone notices after minutes. So while a
session holds a lock, it is told to end itself after `GANTRY_LOCK_IDLE_TIMEOUT_S` of
idleness, in or out of a transaction (`idle_session_timeout`,
`idle_in_transaction_session_timeout`): a silent holder's lock is free again within that
bound, and a holder that comes back finds its session gone (its next statement fails).

The platform's lock order (docs/architecture.md): advisory locks of an org's submission
and quota first, then job rows, then ledger rows, then the budget advisory lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.conf import settings
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


IDLE_TIMEOUTS = ("idle_session_timeout", "idle_in_transaction_session_timeout")


def _try_acquire(cursor, name: str | int) -> bool:
    """pg_try_advisory_lock and, when it got the lock, the session's idle timeouts set,
    in one round trip (see the module's docstring)."""
    key = key_sql("%s", hashed=isinstance(name, str))
    ms = str(max(1, int(settings.GANTRY_LOCK_IDLE_TIMEOUT_S * 1000)))
    set_timeouts = " AND ".join(f"set_config('{s}', %s, false) IS NOT NULL" for s in IDLE_TIMEOUTS)
    cursor.execute(
        f"SELECT CASE WHEN pg_try_advisory_lock({key}) THEN {set_timeouts} ELSE false END",
        [name, *[ms] * len(IDLE_TIMEOUTS)],
    )
    return cursor.fetchone()[0]


def _release(name: str | int) -> None:
    """Unlock and give the session its configured idle timeouts back (one round trip)."""
    key = key_sql("%s", hashed=isinstance(name, str))
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT pg_advisory_unlock({key}), (SELECT count(set_config(name, reset_val,"  # noqa: S608 (a fixed expression)
                " false)) FROM pg_settings WHERE name = ANY(%s))",
                [name, list(IDLE_TIMEOUTS)],
            )
    except DatabaseError:
        # Ending the session is what releases a session-level lock for sure.
        connection.close()


@contextlib.contextmanager
def try_session_lock(name: str | int) -> Iterator[bool]:
    """Yield True while holding the session lock `name`, False (at once) if another
    session holds it. Session-level, so it spans the several transactions of a batch."""
    with connection.cursor() as cursor:
        acquired = _try_acquire(cursor, name)
    try:
        yield acquired
    finally:
        if acquired:
            _release(name)


class LeaderLock:
    """A session lock held from call to call by the one process of its kind (the beat).

    `hold()` answers, without waiting, whether this process leads now: a leader proves
    its session (and so its lock) is still the one that took the lock, a follower tries
    to take it. Called more often than GANTRY_LOCK_IDLE_TIMEOUT_S, a leader keeps its
    session; a leader cut off from the database loses the lock within that bound, and
    when it comes back its first `hold()` finds a new session and answers False unless
    the lock is free again. Guarantee: two processes never both get True for the same
    moment of the database's lock table.
    """

    def __init__(self, name: str):
        self.name = name
        self._backend_pid: int | None = None
        self.last_error = ""  # why the last hold() that failed on the database did

    def hold(self) -> bool:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pid = cursor.fetchone()[0]
                if self._backend_pid == pid:
                    return True  # the same session: the lock is still ours
                self._backend_pid = pid if _try_acquire(cursor, self.name) else None
                return self._backend_pid is not None
        except DatabaseError as exc:
            self.last_error = str(exc).strip()
            self._backend_pid = None
            connection.close()  # a broken or killed session: the next call reconnects
            return False

    def release(self) -> None:
        if self._backend_pid is not None:
            self._backend_pid = None
            _release(self.name)
