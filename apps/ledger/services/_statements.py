"""The ledger's statement compiler: everything one service call writes, in ONE statement.

Changes collects a call's entries, bucket cache deltas, allocations, hold, usage-mark
and budget changes and writes them with one statement of data-modifying CTEs, the last
of the call's LedgerTransaction (services._transaction). Whatever must stop the commit
(a hard budget exceeded, a lock that was not held) is checked inside that statement,
which then raises. All of a call's entries go in by one INSERT, which the database
refuses unless every ledger transaction in it sums to zero (ledger invariant 1,
docs/architecture.md).
"""

# SQL here is composed only of this package's own constant fragments; values are
# always bound parameters.
# ruff: noqa: S608

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import psycopg

from apps.core.ids import new_id
from apps.ledger.metrics import count, count_moved
from apps.ledger.models import Account
from apps.ledger.services._transaction import LOCK_NOT_HELD, LedgerTransaction, refused

# How a posting to each account changes the bucket's cached columns.
_CACHE_COLUMN = {
    Account.ISSUED: ("granted", -1),
    Account.HELD: ("held", 1),
    Account.CAPTURED: ("held", 1),  # Bucket.held caches held + captured
    Account.CONSUMED: ("consumed", 1),
    Account.EXPIRED: ("expired", 1),
}
_BUCKET_COLUMNS = ("granted", "held", "consumed", "expired")


@dataclass
class Changes:
    """Everything one service call writes, flushed with one statement.

    With `new_hold`, the statement also inserts that hold (ON CONFLICT of its
    idempotency key: nothing), and every other write in it is conditional on the insert,
    so a replayed reservation writes nothing at all.
    """

    at: datetime
    org_id: uuid.UUID | None = None
    txn: uuid.UUID = field(default_factory=new_id)
    new_hold: dict | None = None
    entries: list[tuple] = field(default_factory=list)
    bucket_deltas: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0, 0]))
    new_allocations: list[tuple] = field(default_factory=list)  # (hold, bucket, amount)
    allocation_deltas: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0, 0]))
    holds: dict = field(default_factory=dict)  # id -> {column: value}
    marks: list[tuple] = field(default_factory=list)  # (hold, attempt, cumulative, seq)
    # Further CTEs written last, e.g. the budget rows: (name, sql, params, expressions to
    # fetch from it). Their SQL must apply `guard`.
    tail: list[tuple] = field(default_factory=list)
    fetched: dict = field(default_factory=dict)  # name -> the fetched values, or None
    # (SQL condition, SQLSTATE, SQL message): the statement raises unless the condition
    # holds, which aborts the transaction (see ledger_raise in migration 0003).
    checks: list[tuple] = field(default_factory=list)
    counts: dict = field(default_factory=dict)  # rows written per CTE, once flushed
    inserted_hold: bool = False
    # Buckets the statement itself locks, in id order, before writing them (settlement:
    # so they stay locked only while it runs), with whether each has expired by `at`.
    lock_buckets: list = field(default_factory=list)
    expired_if_gone: dict = field(default_factory=lambda: defaultdict(int))
    expired_on_refund: int = 0  # flushed: what the refunds to expired buckets expired

    @property
    def guard(self) -> str:
        """SQL condition every write of the statement is subject to."""
        return "EXISTS (SELECT 1 FROM hi)" if self.new_hold else "TRUE"

    def move(
        self,
        *,
        kind: str,
        bucket_id,
        source: str,
        target: str,
        amount: int,
        hold_id=None,
        job_id=None,
        idempotency_key: str = "",
        usage_until: datetime | None = None,
        memo: str = "",
        org_id=None,
        txn: uuid.UUID | None = None,
        if_expired: bool = False,
    ) -> None:
        """Move `amount` from one account of the bucket to another: two balanced legs.

        `org_id` and `txn` default to the call's; a batch over many holds passes its own
        so that each hold's movements form their own ledger transaction. With
        `if_expired` (available → expired only), the move happens only if the bucket,
        locked by the statement (lock_buckets), has expired by then."""
        if amount <= 0:
            raise ValueError(f"a ledger move needs a positive amount, not {amount}")
        common = (kind, hold_id, job_id, idempotency_key or "", usage_until, memo[:500])
        txn, org_id = txn or self.txn, org_id or self.org_id
        # One row per move; the write statement expands it into its two legs.
        self.entries.append((txn, org_id, bucket_id, source, target, amount, *common, if_expired))
        if if_expired:
            if (source, target) != (Account.AVAILABLE, Account.EXPIRED):
                raise ValueError("only an expiry can depend on the bucket having expired")
            self.expired_if_gone[bucket_id] += amount
            return
        for account, signed in ((source, -amount), (target, amount)):
            if account in _CACHE_COLUMN:
                column, sign = _CACHE_COLUMN[account]
                self.bucket_deltas[bucket_id][_BUCKET_COLUMNS.index(column)] += sign * signed

    def allocation(self, allocation_id, *, amount: int = 0, captured: int = 0, refunded: int = 0):
        delta = self.allocation_deltas[allocation_id]
        delta[0] += amount
        delta[1] += captured
        delta[2] += refunded

    def hold(self, hold_id, **columns) -> None:
        """Set columns of an active hold (amount_delta adds to amount)."""
        self.holds.setdefault(hold_id, {}).update(columns)

    def flush(self, tx: LedgerTransaction, *, update_buckets: bool = True) -> None:
        """Write everything with one statement, the last of the transaction `tx`."""
        params: dict = {"at": self.at}
        guard = self.guard
        parts = []
        if self.lock_buckets:
            params["lb_id"] = sorted(self.lock_buckets)
            parts.append(
                """lb AS (SELECT id, (expired_at IS NOT NULL
                                     OR (expires_at IS NOT NULL AND expires_at <= %(at)s)) AS gone
                            FROM ledger_bucket WHERE id = ANY(%(lb_id)s::uuid[])
                           ORDER BY id FOR NO KEY UPDATE)"""
            )
        elif self.expired_if_gone:
            raise ValueError("a move that depends on expiry needs its bucket in lock_buckets")
        if self.new_hold:
            parts.append(self._new_hold_sql(params))
        if self.marks:
            parts.append(self._marks_sql(params))
        if self.new_allocations:
            columns = [list(col) for col in zip(*self.new_allocations, strict=True)]
            params.update(zip(("na_h", "na_b", "na_a"), columns, strict=True))
            parts.append(
                f"""na AS (INSERT INTO ledger_holdallocation
                                  (hold_id, bucket_id, amount, captured, refunded)
                           SELECT h, b, a, 0, 0
                             FROM unnest(%(na_h)s::uuid[], %(na_b)s::uuid[], %(na_a)s::bigint[])
                                  AS t(h, b, a)
                            WHERE {guard}
                           RETURNING 1)"""
            )
        if self.allocation_deltas:
            ids = list(self.allocation_deltas)
            params["ua_id"] = ids
            for n, column in enumerate(("amount", "captured", "refunded")):
                params[f"ua_{column}"] = [self.allocation_deltas[i][n] for i in ids]
            parts.append(
                f"""ua AS (UPDATE ledger_holdallocation AS x
                              SET amount = x.amount + d.amount,
                                  captured = x.captured + d.captured,
                                  refunded = x.refunded + d.refunded
                             FROM unnest(%(ua_id)s::bigint[], %(ua_amount)s::bigint[],
                                         %(ua_captured)s::bigint[], %(ua_refunded)s::bigint[])
                                  AS d(id, amount, captured, refunded)
                            WHERE x.id = d.id AND {guard}
                           RETURNING 1)"""
            )
        if self.entries:
            parts.append(self._entries_sql(params))
        changed = {b: d for b, d in self.bucket_deltas.items() if any(d)} if update_buckets else {}
        changed.update({b: self.bucket_deltas[b] for b in self.expired_if_gone})
        if changed:
            ids = list(changed)
            params["ub_id"] = ids
            for n, column in enumerate(_BUCKET_COLUMNS):
                params[f"ub_{column}"] = [changed[i][n] for i in ids]
            params["ub_if_gone"] = [self.expired_if_gone.get(i, 0) for i in ids]
            # Joined to lb when the statement locks the buckets: every lock is taken, in
            # id order, before the first bucket row is written.
            gone = "CASE WHEN lb.gone THEN d.if_gone ELSE 0 END" if self.lock_buckets else "0"
            locked = "JOIN lb ON lb.id = d.id" if self.lock_buckets else ""
            parts.append(
                f"""ub AS (UPDATE ledger_bucket AS b
                              SET granted = b.granted + d.granted, held = b.held + d.held,
                                  consumed = b.consumed + d.consumed,
                                  expired = b.expired + d.expired + {gone}
                             FROM unnest(%(ub_id)s::uuid[], %(ub_granted)s::bigint[],
                                         %(ub_held)s::bigint[], %(ub_consumed)s::bigint[],
                                         %(ub_expired)s::bigint[], %(ub_if_gone)s::bigint[])
                                  AS d(id, granted, held, consumed, expired, if_gone) {locked}
                            WHERE b.id = d.id AND {guard}
                           RETURNING {gone} AS gone)"""
            )
        if self.holds:
            parts.append(self._holds_sql(params))
        fetch = []
        for name, sql, extra, expressions in self.tail:
            parts.append(f"{name} AS ({sql})")
            params.update(extra)
            fetch += [f"(SELECT {expr} FROM {name})" for expr in expressions]
        if not parts:
            return
        names = [part.split(" ", 1)[0] for part in parts]
        # Row counts the locks guarantee; a mismatch refuses the whole statement.
        expected = {"ub": len(changed), "uh": len(self.holds), "ua": len(self.allocation_deltas)}
        checks = [
            (
                f"NOT {guard} OR (SELECT count(*) FROM {name}) = {want}",
                LOCK_NOT_HELD,
                f"'ledger write touched an unlocked row of {name}'",
            )
            for name, want in expected.items()
            if name in names
        ] + self.checks
        selected = [f"(SELECT count(*) FROM {name})" for name in names] + fetch
        selected.append("(SELECT coalesce(sum(gone), 0) FROM ub)" if "ub" in names else "0")
        selected += [
            f"CASE WHEN NOT ({ok}) THEN ledger_raise('{code}', {message}) END"
            for ok, code, message in checks
        ]
        sql = "WITH " + ",\n".join(parts) + "\nSELECT " + ", ".join(selected)
        row = tx.write(sql, params)
        counts = self.counts = dict(zip(names, row, strict=False))
        values = iter(row[len(names) :])
        for name, _sql, _extra, expressions in self.tail:
            got = tuple(next(values) for _ in expressions)
            self.fetched[name] = got if counts[name] else None
        self.expired_on_refund = next(values)
        self.inserted_hold = bool(counts.get("hi"))
        if self.entries and (self.inserted_hold or not self.new_hold):
            moved = [(e[6], e[5]) for e in self.entries if not e[12]]  # (kind, amount)
            moved.append(("expire", self.expired_on_refund))
            tx.after_commit(lambda: count_moved(moved))

    def _new_hold_sql(self, params: dict) -> str:
        params.update({f"hi_{k}": v for k, v in self.new_hold.items()})
        return """hi AS (INSERT INTO ledger_hold
                                (id, org_id, project_id, user_id, job_ref, requested_amount,
                                 amount, captured, refunded, usage, state, idempotency_key,
                                 expires_at, reason, created_at)
                         VALUES (%(hi_id)s, %(hi_org)s, %(hi_project)s, %(hi_user)s,
                                 %(hi_job)s, %(hi_amount)s, %(hi_amount)s, 0, 0, 0, 'active',
                                 %(hi_key)s, %(hi_expires_at)s, '', %(at)s)
                         ON CONFLICT (org_id, idempotency_key) DO NOTHING
                         RETURNING 1)"""

    def _marks_sql(self, params: dict) -> str:
        columns = [list(col) for col in zip(*self.marks, strict=True)]
        params.update(zip(("m_h", "m_k", "m_c", "m_s"), columns, strict=True))
        return """m AS (INSERT INTO ledger_usagemark (hold_id, attempt_key, cumulative, seq,
                                                     updated_at)
                        SELECT h, k, c, s, %(at)s
                          FROM unnest(%(m_h)s::uuid[], %(m_k)s::text[], %(m_c)s::bigint[],
                                      %(m_s)s::bigint[]) AS t(h, k, c, s)
                        ON CONFLICT (hold_id, attempt_key) DO UPDATE
                           SET cumulative = EXCLUDED.cumulative, seq = EXCLUDED.seq,
                               updated_at = EXCLUDED.updated_at
                        RETURNING 1)"""

    def _entries_sql(self, params: dict) -> str:
        names = (
            "txn",
            "org",
            "bucket",
            "source",
            "target",
            "amount",
            "kind",
            "hold",
            "job",
            "key",
            "until",
            "memo",
            "if_expired",
        )
        columns = [list(col) for col in zip(*self.entries, strict=True)]
        params.update({f"e_{n}": col for n, col in zip(names, columns, strict=True)})
        expired = "LEFT JOIN lb ON lb.id = m.bucket" if self.lock_buckets else ""
        applies = "(NOT m.if_expired OR lb.gone)" if self.lock_buckets else "NOT m.if_expired"
        # ORDER BY: entry ids in the order of the moves, each debit before its credit,
        # whatever join order the plan takes.
        return f"""e AS (INSERT INTO ledger_entry (txn, org_id, bucket_id, account,
                                                  counter_account, amount, kind, hold_id,
                                                  job_id, idempotency_key, usage_until, memo,
                                                  created_at)
                         SELECT m.txn, m.org, m.bucket, leg.account, leg.counter, leg.amount,
                                m.kind, m.hold, m.job, m.key, m.until, m.memo, %(at)s
                           FROM unnest(%(e_txn)s::uuid[], %(e_org)s::uuid[],
                                       %(e_bucket)s::uuid[], %(e_source)s::text[],
                                       %(e_target)s::text[], %(e_amount)s::bigint[],
                                       %(e_kind)s::text[], %(e_hold)s::uuid[], %(e_job)s::uuid[],
                                       %(e_key)s::text[], %(e_until)s::timestamptz[],
                                       %(e_memo)s::text[], %(e_if_expired)s::boolean[])
                                WITH ORDINALITY
                                AS m(txn, org, bucket, source, target, amount, kind, hold, job,
                                     key, until, memo, if_expired, n)
                           {expired}
                          CROSS JOIN LATERAL (VALUES (m.source, m.target, -m.amount),
                                                     (m.target, m.source, m.amount))
                                AS leg(account, counter, amount)
                          WHERE {self.guard} AND {applies}
                          ORDER BY m.n, leg.amount
                         RETURNING 1)"""

    def _holds_sql(self, params: dict) -> str:
        ids = list(self.holds)
        columns = (
            "amount_delta",
            "usage",
            "captured",
            "refunded",
            "state",
            "reason",
            "settled_at",
            "metered_at",
            "expires_at",
        )
        params["h_id"] = ids
        # The guard "still active" comes as a parameter, not a constant: a constant would
        # tempt the planner into scanning the partial index of all active holds.
        params["h_was"] = ["active"] * len(ids)
        for column in columns:
            params[f"h_{column}"] = [self.holds[i].get(column) for i in ids]
        return """uh AS (UPDATE ledger_hold AS h
                            SET amount = h.amount + coalesce(d.amount_delta, 0),
                                usage = coalesce(d.usage, h.usage),
                                captured = coalesce(d.captured, h.captured),
                                refunded = coalesce(d.refunded, h.refunded),
                                state = coalesce(d.state, h.state),
                                reason = coalesce(d.reason, h.reason),
                                settled_at = coalesce(d.settled_at, h.settled_at),
                                metered_at = coalesce(d.metered_at, h.metered_at),
                                expires_at = greatest(h.expires_at, d.expires_at)
                           FROM unnest(%(h_id)s::uuid[], %(h_amount_delta)s::bigint[],
                                       %(h_usage)s::bigint[], %(h_captured)s::bigint[],
                                       %(h_refunded)s::bigint[], %(h_state)s::text[],
                                       %(h_reason)s::text[], %(h_settled_at)s::timestamptz[],
                                       %(h_metered_at)s::timestamptz[],
                                       %(h_expires_at)s::timestamptz[], %(h_was)s::text[])
                                AS d(id, amount_delta, usage, captured, refunded, state, reason,
                                     settled_at, metered_at, expires_at, was)
                          WHERE h.id = d.id AND h.state = d.was
                         RETURNING 1)"""


def refused_by_budget(error: psycopg.Error, *, op: str) -> Exception:
    """The domain error for a write that refused itself (counted), else the error."""
    mapped = refused(error)
    if mapped is not error:
        count(op, "budget_exceeded")
    return mapped


def flush(changes: Changes, tx: LedgerTransaction, *, op: str) -> None:
    """Write the call's changes; a hard budget refusal becomes BudgetExceeded (403)."""
    try:
        changes.flush(tx)
    except psycopg.Error as error:
        raise refused_by_budget(error, op=op) from error
