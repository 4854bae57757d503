"""The transaction of one ledger service call, and what reads under its locks.

The hot paths (reserve, settle, meter, fold) are written for few round trips, because
on a busy machine every round trip is a wake-up that waits for a CPU: a service call
reads under its locks with one statement, sent together with BEGIN, and writes with one
statement (services._statements.Changes), sent together with COMMIT (psycopg pipeline
mode): a settle is two round trips, a reserve (one statement that draws and writes)
one. Inside a caller's transaction it is a savepoint, and commits with the caller.

Lock order: holds first (by the reading statement), then buckets in id order, then
budget rows org → project → user. Hot rows (buckets, budgets) are locked by the write
statement itself where it can (settle, reserve), so they stay locked only while it runs
and commits, never across a round trip to the client.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from psycopg.pq import TransactionStatus

from apps.core.errors import BudgetExceeded
from apps.core.locks import xact_lock_sql
from apps.core.sql import commits_on_exit, execute

# SQLSTATEs raised by ledger_raise() (migration 0003) from inside a write statement.
BUDGET_EXCEEDED = "GLB01"
LOCK_NOT_HELD = "GLX01"
LANE_FALLBACK = "GLL01"  # the lanes a reservation chose cannot serve it: try them all
INSUFFICIENT_CREDITS = "GLC01"  # a reservation found less credit than it asked for
BUDGETS_EXIST = "GLB02"  # a reservation sent without the budgets' part found the org has some


class LedgerTransaction:
    """The transaction of one service call (see the module docstring).

    `query()` runs a read, `write()` the final write. Alone, the call's first statement
    goes with BEGIN and its write with COMMIT. Inside the caller's transaction, the call
    is a savepoint of it, opened with its first statement and released with its write
    (the same round trips), and rolled back to on an error, leaving the caller's
    transaction usable; nothing is committed here. `after_commit()` runs a callback once
    the whole transaction has committed.

    `savepoint=False` (inside the caller's transaction only): the call opens no
    savepoint of its own, two statements and a subtransaction fewer, for a caller whose
    transaction stands or falls with this call: an error leaves that transaction
    aborted, and the caller's atomic block rolls it back.
    """

    # One name serves: a nested call shadows it (PostgreSQL uses the newest of a name).
    SAVEPOINT = "gantry_ledger"

    def __init__(self, *, savepoint: bool = True) -> None:
        self.savepoint = savepoint
        self.db = connections[DEFAULT_DB_ALIAS]  # looked up once: the proxy is not free
        self.pg: psycopg.Connection | None = None
        self.owned = False  # BEGIN and COMMIT are ours
        self.nested = False  # a savepoint of the caller's atomic block
        self._atomic = None  # manual transaction management: Django's savepoint
        self._begun = False
        self._finished = False  # committed (owned) or released (nested)
        self._hooks: list[Callable[[], None]] = []

    def __enter__(self) -> LedgerTransaction:
        self.db.ensure_connection()
        self.pg = self.db.connection
        if self.db.in_atomic_block:
            self.nested = True
        elif not self.db.get_autocommit():
            self._atomic = transaction.atomic(using=self.db.alias)
            self._atomic.__enter__()
            self._begun = True
        else:
            self.owned = True
        return self

    def _open(self) -> None:
        """Queue what starts this call (inside a pipeline, before its first statement)."""
        if self._begun:
            return
        self._begun = True
        if self.owned:
            self.pg.execute("BEGIN")
        elif self.savepoint:
            self.pg.execute(f"SAVEPOINT {self.SAVEPOINT}")

    def query(self, sql: str, params, *, first: tuple = ()) -> list[tuple]:
        """A read, after the `first` (sql, params) statements, in one round trip. Each
        statement has its own snapshot: a read after a statement that waited for a lock
        sees what the lock's previous holder committed."""
        if self._begun and not first:
            return execute(self.pg, sql, params).fetchall()
        with self.pg.pipeline():
            self._open()
            for statement, values in first:
                execute(self.pg, statement, values)
            cursor = execute(self.pg, sql, params)
        return cursor.fetchall()

    def write(
        self, sql: str, params, *, first: tuple = (), then: tuple = (), last: bool = False
    ) -> tuple:
        """The call's last statement, after the `first` (sql, params) statements: one
        round trip, with the BEGIN/SAVEPOINT if nothing was sent yet and the
        COMMIT/RELEASE. The caller's `then` statements follow it in the same round trip
        (they run only if it succeeded). `last`: nothing else runs in the caller's
        atomic block after this call; when that block is the outermost, its COMMIT is
        sent here too (as apps.core.sql.execute_last does).

        A transaction of ours that is all in this round trip (a reservation) sends no
        BEGIN and no COMMIT: the statements of one pipeline sync are one implicit
        transaction, which PostgreSQL commits at the sync, or rolls back whole on an
        error. Two statements fewer to send, parse and run."""
        implicit = self.owned and not self._begun
        refusal = None
        try:
            with self.pg.pipeline():
                try:
                    if not implicit:
                        self._open()
                    for statement, values in first:
                        execute(self.pg, statement, values)
                    cursor = execute(self.pg, sql, params)
                    for statement, values in then:
                        execute(self.pg, statement, values)
                    if self.owned and not implicit:
                        self.pg.execute("COMMIT")
                    elif self.nested and self.savepoint:
                        self.pg.execute(f"RELEASE SAVEPOINT {self.SAVEPOINT}")
                    if self.nested and last and commits_on_exit(self.db):
                        self.pg.execute("COMMIT")
                except psycopg.Error as error:
                    # A statement refused itself (a budget, the credit) while later ones
                    # were queued: the pipeline's exit reports the abort again, which
                    # psycopg would log as a warning beside this error. Raise this one.
                    refusal = error
        except psycopg.Error:
            if refusal is None:
                raise
        if refusal is not None:
            raise refusal
        self._begun = self._finished = True
        return cursor.fetchone()

    def after_commit(self, callback: Callable[[], None]) -> None:
        if self.owned:
            self._hooks.append(callback)
        else:
            transaction.on_commit(callback)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._atomic is not None:
            return bool(self._atomic.__exit__(exc_type, exc, tb))
        if self.pg.closed:
            self.db.close()  # Django's wrapper did not see it break: reconnect next time
            return False
        if self.nested:
            if self.savepoint and self._begun and not self._finished:
                if exc_type is not None:  # undo this call only
                    self.pg.execute(f"ROLLBACK TO SAVEPOINT {self.SAVEPOINT}")
                self.pg.execute(f"RELEASE SAVEPOINT {self.SAVEPOINT}")
            return False
        if not self._finished and self.pg.info.transaction_status != TransactionStatus.IDLE:
            # An error, or a call that only read (a replay): nothing to keep.
            self.pg.execute("ROLLBACK")
        if exc_type is None and self._finished:
            for hook in self._hooks:
                hook()
        return False


def refused(error: psycopg.Error) -> Exception:
    """The domain error for a write statement that refused itself, else the error."""
    if error.sqlstate == BUDGET_EXCEEDED:
        return BudgetExceeded(error.diag.message_primary, field="amount")
    return error


def ledger_setting(name: str, default):
    return getattr(settings, f"GANTRY_LEDGER_{name}", default)


def budget_lock_sql(org_sql: str, *, shared: bool = True) -> str:
    """SQL taking the org's budget advisory lock (see services.budgets)."""
    return xact_lock_sql(f"'gantry.ledger.budgets:' || {org_sql}", shared=shared)


def has_budget_sql(org_sql: str) -> str:
    """SQL: whether the org has a budget at any level. Read after the org's shared budget
    lock, the answer holds until the commit (set_budget takes that lock exclusively)."""
    # org_sql is the caller's constant SQL (a column or a placeholder), never a value.
    return f"EXISTS (SELECT 1 FROM ledger_budget WHERE org_id = {org_sql})"  # noqa: S608


@dataclass
class LockedHold:
    """A hold row read under its row lock; the services change it, Changes writes it."""

    pk: uuid.UUID
    org_id: uuid.UUID
    project_id: uuid.UUID | None
    user_id: uuid.UUID | None
    job_ref: uuid.UUID | None
    idempotency_key: str
    amount: int
    captured: int
    refunded: int
    usage: int
    state: str
    reason: str
    expires_at: datetime
    metered_at: datetime | None
    settled_at: datetime | None
    created_at: datetime
    lane: int

    COLUMNS = (
        "id, org_id, project_id, user_id, job_ref, idempotency_key, amount, captured, "
        "refunded, usage, state, reason, expires_at, metered_at, settled_at, created_at, lane"
    )
