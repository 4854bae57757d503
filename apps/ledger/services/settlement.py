"""Settlement: close a hold exactly once, at its usage, every unused micro-credit back to
the bucket it came from.

A settle is two round trips: one statement that locks the hold and reads its
allocations, one that writes everything, locking the buckets and budgets it changes only
while it runs (services._transaction). Lock order: the hold, then buckets by id, then
budgets org → project → user.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from django.db import connection

from apps.core import locks
from apps.ledger.metrics import count
from apps.ledger.models import Account, EntryKind, Hold, HoldState
from apps.ledger.services import budgets
from apps.ledger.services._statements import Changes, flush
from apps.ledger.services._transaction import LedgerTransaction
from apps.ledger.services.metering import (
    UsageReport,
    apply_usage,
    lock_one,
    slots_from_rows,
    validate_report,
)


@dataclass(frozen=True)
class SettleResult:
    hold_id: uuid.UUID
    state: str
    reason: str
    amount: int
    captured: int
    refunded: int
    usage: int
    overrun: int  # reported usage that the hold could not cover (written off)
    settled_at: datetime
    replayed: bool  # True: the hold was already closed; nothing moved this time

    @classmethod
    def of(cls, hold, *, replayed: bool) -> SettleResult:
        return cls(
            hold_id=hold.pk,
            state=hold.state,
            reason=hold.reason,
            amount=hold.amount,
            captured=hold.captured,
            refunded=hold.refunded,
            usage=hold.usage,
            overrun=max(0, hold.usage - hold.captured),
            settled_at=hold.settled_at,
            replayed=replayed,
        )


def settle(
    hold, *, reason: str, final_usage: int | None = None, attempt_key: str = ""
) -> SettleResult:
    """Close the hold: capture its usage and return every unused micro-credit to the
    exact bucket it came from.

    `final_usage`, if given, is the final cumulative usage of `attempt_key` (the same
    max-wins semantics as meter). A refund to a bucket that has expired meanwhile is
    recorded and then expired, never spendable again. At most once: the hold row is
    locked and only an active hold moves money; every later or concurrent call returns
    the first result (replayed=True) and writes nothing.
    """
    if final_usage is not None:
        validate_report(cumulative_usage=final_usage, seq=None, attempt_key=attempt_key)
    return _close(
        hold.pk,
        state=HoldState.SETTLED,
        reason=reason,
        final_usage=final_usage,
        attempt_key=attempt_key,
        op="settle",
    )


def release(hold, *, reason: str) -> Hold:
    """Close the hold of a job that never ran: everything goes back to its buckets.

    It is settle without new usage: if usage was metered after all, that much stays
    captured and the hold ends settled rather than released. At most once.
    """
    _close(
        hold.pk,
        state=HoldState.RELEASED,
        reason=reason,
        final_usage=None,
        attempt_key="",
        op="release",
    )
    hold.refresh_from_db()
    return hold


def expire_stale_holds(*, limit: int = 200) -> int:
    """Settle, at their metered usage, active holds past their expires_at (database clock):
    the finish call never came. Each is closed once, whoever else tries concurrently.
    Returns the number of holds this call closed."""
    closed = 0
    with locks.try_session_lock("gantry.ledger.expire_stale_holds") as acquired:
        if not acquired:
            return 0
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id, expires_at FROM ledger_hold WHERE state = 'active' "
                    "AND expires_at <= statement_timestamp() ORDER BY expires_at, id LIMIT %s",
                    [limit],
                )
                due = cursor.fetchall()
            for pk, expires_at in due:
                reason = (
                    f"hold expired at {expires_at.isoformat()} without a settle; "
                    "recovered at its metered usage"
                )
                result = _close(
                    pk,
                    state=HoldState.EXPIRED,
                    reason=reason,
                    final_usage=None,
                    attempt_key="",
                    op="expire_hold",
                )
                closed += not result.replayed
            if len(due) < limit:
                return closed


def _close(hold_id, *, state, reason, final_usage, attempt_key, op) -> SettleResult:
    reason = reason[:500]
    with LedgerTransaction() as tx:
        hold, now, marks, allocations, has_budgets = lock_one(
            tx,
            hold_id,
            attempt_key=attempt_key if final_usage is not None else None,
            budget_lock=True,
        )
        if hold.state != HoldState.ACTIVE:
            count(op, "replay")
            return SettleResult.of(hold, replayed=True)
        # The buckets are locked by the write itself, in id order: held only while it runs.
        changes = Changes(
            at=now, org_id=hold.org_id, lock_buckets=[a.bucket_id for a in allocations]
        )
        reports = (
            [] if final_usage is None else [UsageReport(hold_id, attempt_key, final_usage, None)]
        )
        apply_usage(
            tx,
            {hold_id: hold},
            reports,
            now=now,
            capture_backlog=True,
            changes=changes,
            slots=slots_from_rows(a.slot_row() for a in allocations),
            marks=marks,
        )
        if hold.captured and state == HoldState.RELEASED:
            state = HoldState.SETTLED  # usage was metered: it stays charged
        refunded = _closing_moves(changes, hold, allocations, state=state, reason=reason)
        changes.hold(hold_id, state=state, refunded=refunded, reason=reason, settled_at=now)
        if has_budgets:  # else no budget counts this hold, nor can one before the commit
            budgets.discharge(
                changes,
                org_id=hold.org_id,
                project_id=hold.project_id,
                user_id=hold.user_id,
                amount=hold.amount,
                captured=hold.captured,
                lane=hold.lane,
            )
        flush(changes, tx, op=op)
        hold.state, hold.refunded, hold.reason, hold.settled_at = state, refunded, reason, now
    count(op)
    return SettleResult.of(hold, replayed=False)


def _closing_moves(changes: Changes, hold, allocations, *, state, reason) -> int:
    """Captured usage becomes consumption; the rest goes back to the bucket it came from
    (and straight on to expired if that bucket has expired). Returns what was refunded."""
    common = {"hold_id": hold.pk, "job_id": hold.job_ref, "idempotency_key": hold.idempotency_key}
    captured_now = {a: d[1] for a, d in changes.allocation_deltas.items()}
    for allocation in allocations:
        captured = allocation.captured + captured_now.get(allocation.id, 0)
        if captured:
            changes.move(
                kind=EntryKind.SETTLE,
                bucket_id=allocation.bucket_id,
                source=Account.CAPTURED,
                target=Account.CONSUMED,
                amount=captured,
                memo=reason,
                **common,
            )
    refund_kind = EntryKind.RELEASE if state == HoldState.RELEASED else EntryKind.REFUND
    total = 0
    for allocation in allocations:
        captured = allocation.captured + captured_now.get(allocation.id, 0)
        unused = allocation.amount - captured - allocation.refunded
        if not unused:
            continue
        changes.allocation(allocation.id, refunded=unused)
        changes.move(
            kind=refund_kind,
            bucket_id=allocation.bucket_id,
            source=Account.HELD,
            target=Account.AVAILABLE,
            amount=unused,
            memo=reason,
            **common,
        )
        # A refund to a bucket that has expired is recorded, then expired; whether it has
        # is decided under the bucket's lock by the write statement (expiry may be
        # sweeping it right now).
        changes.move(
            kind=EntryKind.EXPIRE,
            bucket_id=allocation.bucket_id,
            source=Account.AVAILABLE,
            target=Account.EXPIRED,
            amount=unused,
            memo="refund to an expired bucket",
            if_expired=True,
            **common,
        )
        total += unused
    return total
