"""Metering: cumulative usage reports captured against a hold's allocations.

Heartbeats touch only per-hold rows (the hold and its usage marks): a report raises the
hold's live `usage` at once. Capturing that usage into the ledger (entries moving credit
from the bucket's `held` account to its `captured` account, both cached in Bucket.held,
so no bucket row is written until the hold settles) happens at most once per
GANTRY_LEDGER_CAPTURE_INTERVAL_S per hold, and at settlement: a running job adds about
one capture entry a minute instead of one per heartbeat fold. `metered_at` is the
instant the hold's usage was last captured (the start of the next capture's window).
Nothing that guards money waits for a capture: the hold's amount is held from the
reservation on (balances and budgets count it whole), and headroom is what the hold
can still take after its live usage. The same code meters one report (meter) and a
batch of thousands (fold_usage_reports) with a fixed number of statements per batch.
"""

# SQL here is composed only of this package's own constant fragments; values are
# always bound parameters.
# ruff: noqa: S608

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from apps.core.clock import db_now
from apps.core.errors import GantryError
from apps.core.ids import new_id
from apps.ledger.allocation import Slot, burn_key, headroom, split_capture
from apps.ledger.metrics import count
from apps.ledger.models import Account, EntryKind, Hold, HoldState
from apps.ledger.services._statements import Changes
from apps.ledger.services._transaction import (
    LedgerTransaction,
    LockedHold,
    budget_lock_sql,
    has_budget_sql,
    ledger_setting,
)
from apps.ledger.services._validation import non_negative

MAX_ATTEMPT_KEY = 200
HOLD_COLUMNS = len(LockedHold.COLUMNS.split(", "))


@dataclass(frozen=True)
class UsageReport:
    """Cumulative usage of one attempt. seq None: ordered by cumulative alone (a final
    report, or one folded from Redis, which keeps only the largest)."""

    hold_id: uuid.UUID
    attempt_key: str
    cumulative: int
    seq: int | None


@dataclass(frozen=True)
class MeterResult:
    hold_id: uuid.UUID
    applied: bool  # False: duplicate, older, smaller, or the hold is no longer active
    state: str
    amount: int
    usage: int  # sum over attempts of their largest cumulative report
    captured: int
    headroom: int  # what can still be captured for future usage (unexpired buckets)
    overrun: int  # usage that could not be captured (beyond the hold, or expired room)
    would_run_out: bool  # extend the hold or stop the job


def validate_report(*, cumulative_usage, seq, attempt_key) -> None:
    non_negative(cumulative_usage, field="cumulative_usage")
    if seq is not None:
        non_negative(seq, field="seq")
    if not isinstance(attempt_key, str) or len(attempt_key) > MAX_ATTEMPT_KEY:
        raise GantryError(
            f"attempt_key must be a string of at most {MAX_ATTEMPT_KEY} characters.",
            code="invalid",
            field="attempt_key",
        )


def meter(hold, *, cumulative_usage: int, seq: int, attempt_key: str = "") -> MeterResult:
    """Record the cumulative usage (micro-credits) of one attempt of the hold's job.

    Idempotent and monotonic per (hold, attempt_key): a report applies only if both its
    seq and its cumulative exceed the last applied ones, so duplicated or reordered
    reports change nothing. The hold's usage is the sum over attempts, live at once;
    it is captured against the allocations (at most once per capture interval, see the
    module docstring) in spend order, never from a bucket for usage accrued at or after
    its expiry, and never beyond the hold's amount (the rest is reported as overrun).
    `would_run_out` tells the caller to extend or stop the job.
    """
    validate_report(cumulative_usage=cumulative_usage, seq=seq, attempt_key=attempt_key)
    report = UsageReport(hold.pk, attempt_key, cumulative_usage, seq)
    with LedgerTransaction() as tx:
        locked, now, marks, allocations, _budgets = lock_one(tx, hold.pk, attempt_key=attempt_key)
        results = apply_usage(
            tx,
            {locked.pk: locked},
            [report],
            now=now,
            marks=marks,
            slots=slots_from_rows(a.slot_row() for a in allocations),
        )
    result = results[hold.pk]
    count("meter", "ok" if result.applied else "unchanged")
    hold.usage, hold.captured, hold.state = result.usage, result.captured, result.state
    return result


def lock_holds(
    tx: LedgerTransaction,
    hold_ids: Iterable,
    *,
    attempt_key: str | None = None,
    budget_lock: bool = False,
) -> tuple[dict, datetime, dict | None]:
    """Lock the holds in id order (the platform's lock order: holds before buckets).

    Returns ({id: LockedHold}, the statement's database time, marks). With attempt_key,
    the statement also reads that attempt's usage mark: marks is then
    {(hold, attempt_key): (cumulative, seq)}, else None. With budget_lock it also takes
    the holds' orgs' shared budget lock (see services.budgets), so that a later write
    may touch budgets.
    """
    ids = sorted({h if isinstance(h, uuid.UUID) else uuid.UUID(str(h)) for h in hold_ids})
    if not ids:
        return {}, db_now(), None
    columns = ", ".join(f"h.{c}" for c in LockedHold.COLUMNS.split(", "))
    join = ""
    if attempt_key is not None:
        join = "LEFT JOIN ledger_usagemark m ON m.hold_id = h.id AND m.attempt_key = %s "
        columns += ", m.cumulative, m.seq"
    lock = f", {budget_lock_sql('h.org_id::text')}" if budget_lock else ""
    # A joined usage mark must be read after the lock, by a statement of its own (see
    # lock_one); the hold rows alone are re-read by the locking statement itself.
    lock_first = (
        "SELECT id FROM ledger_hold WHERE id = ANY(%s::uuid[]) ORDER BY id FOR NO KEY UPDATE"
    )
    first = [(lock_first, [ids])] if join else []
    rows = tx.query(
        f"SELECT {columns}, statement_timestamp(){lock} FROM ledger_hold h {join}"
        "WHERE h.id = ANY(%s::uuid[]) ORDER BY h.id FOR NO KEY UPDATE OF h",
        [attempt_key, ids] if join else [ids],
        first=first,
    )
    n = HOLD_COLUMNS
    holds = {row[0]: LockedHold(*row[:n]) for row in rows}
    now = rows[0][-2 if budget_lock else -1] if rows else db_now()
    marks = None
    if attempt_key is not None:
        marks = {(row[0], attempt_key): (row[n], row[n + 1]) for row in rows if row[n] is not None}
    return holds, now, marks


@dataclass(frozen=True)
class AllocationRow:
    """One allocation of a locked hold, with what the services need of its bucket."""

    id: int
    hold_id: uuid.UUID
    bucket_id: uuid.UUID
    amount: int
    captured: int
    refunded: int
    expires_at: datetime | None
    kind: str
    created_at: datetime
    expired_at: datetime | None

    def slot_row(self) -> tuple:
        return (
            self.id,
            self.hold_id,
            self.bucket_id,
            self.amount - self.captured - self.refunded,
            self.expires_at,
            self.kind,
            self.created_at,
        )


def lock_one(
    tx: LedgerTransaction,
    hold_id,
    *,
    attempt_key: str | None = None,
    lock_buckets: bool = False,
    budget_lock: bool = False,
) -> tuple[LockedHold, datetime, dict | None, list[AllocationRow], bool | None]:
    """Lock one hold, then read its allocations with their buckets and (with
    attempt_key) that attempt's usage mark: two statements, one round trip.

    The lock comes first, in a statement of its own: a statement that waits for a row
    lock re-reads only the locked rows, so a read joined to the lock would see the
    allocations and usage mark as they were before the previous holder (a usage fold, a
    concurrent settle) committed, and capture or refund against stale figures. The read
    then returns rows in bucket id order, each locking its bucket after the hold (with
    lock_buckets: the platform's lock order, the hold, then buckets by id). With
    budget_lock the first statement also takes the org's shared budget lock, and the
    last element says whether the org has a budget (None without the lock): read under
    that lock, it stays true until the commit, since set_budget takes the lock exclusively.
    Raises Hold.DoesNotExist for an unknown hold.
    """
    budget = f", {budget_lock_sql('org_id::text')}" if budget_lock else ""
    # Unknown (NULL) without the lock: a budget may be created meanwhile.
    has_budgets = has_budget_sql("h.org_id") if budget_lock else "NULL"
    lock = (
        f"SELECT id{budget} FROM ledger_hold WHERE id = %(id)s FOR NO KEY UPDATE",
        {"id": hold_id},
    )
    hold_columns = ", ".join(f"h.{c}" for c in LockedHold.COLUMNS.split(", "))
    rows = tx.query(
        f"""
        SELECT {hold_columns}, m.cumulative, m.seq, a.id, a.hold_id, a.bucket_id, a.amount,
               a.captured, a.refunded, b.expires_at, b.kind, b.created_at, b.expired_at,
               statement_timestamp(), {has_budgets}
          FROM ledger_hold h
          LEFT JOIN ledger_usagemark m ON m.hold_id = h.id AND m.attempt_key = %(key)s
          JOIN ledger_holdallocation a ON a.hold_id = h.id
          JOIN ledger_bucket b ON b.id = a.bucket_id
         WHERE h.id = %(id)s
         ORDER BY b.id
           FOR NO KEY UPDATE OF h{", b" if lock_buckets else ""}
        """,
        {"id": hold_id, "key": attempt_key},
        first=[lock],
    )
    if not rows:
        raise Hold.DoesNotExist(f"No hold {hold_id}.")
    first, n = rows[0], HOLD_COLUMNS
    marks = None
    if attempt_key is not None:
        marks = {(first[0], attempt_key): (first[n], first[n + 1])} if first[n] is not None else {}
    allocations = [AllocationRow(*row[n + 2 : n + 12]) for row in rows]
    return LockedHold(*first[:n]), first[n + 12], marks, allocations, first[n + 13]


def apply_usage(
    tx: LedgerTransaction,
    holds: dict,
    reports: Iterable[UsageReport],
    *,
    now: datetime,
    capture_backlog: bool = False,
    changes: Changes | None = None,
    slots: dict | None = None,
    marks: dict | None = None,
) -> dict:
    """Apply reports to locked holds and capture what is new. Returns {hold_id: MeterResult}.

    With capture_backlog, every active hold captures up to its usage even without a new
    report (settlement: usage that found no room earlier may find it after an extend).
    Writes through `changes` (flushed by the caller) or its own Changes, flushed here;
    `slots` (the holds' allocations) and `marks` (the reported attempts' usage marks)
    are passed when the caller has read them already.
    """
    latest: dict[tuple, UsageReport] = {}
    for report in reports:
        key = (report.hold_id, report.attempt_key)
        if key not in latest or _rank(report) > _rank(latest[key]):
            latest[key] = report
    active = {pk: h for pk, h in holds.items() if h.state == HoldState.ACTIVE}
    own = changes is None
    changes = changes or Changes(at=now)
    changed = _apply_marks(
        tx, active, [r for k, r in latest.items() if k[0] in active], changes, marks=marks
    )

    # A duplicate or stale report changes nothing, not even a pending capture. A new one
    # is captured once the hold's last capture is an interval old.
    if capture_backlog:
        capturing = set(active)
    else:
        interval = ledger_setting("CAPTURE_INTERVAL_S", 60.0)
        capturing = {hid for hid in changed if _capture_due(active[hid], now, interval)}
    if slots is None:
        slots = slots_of(tx, {hid for hid, _ in latest if hid in active} | capturing)
    for hid in sorted(capturing):
        hold = active[hid]
        due = min(hold.usage, hold.amount) - hold.captured
        if due > 0:
            _capture(hold, due, slots, changes, now=now)
    for hid in changed | capturing:
        hold = active[hid]
        changes.hold(hid, usage=hold.usage, captured=hold.captured)
        if hid in capturing:
            changes.hold(hid, metered_at=now)
    if own:
        changes.flush(tx)

    results = {}
    fraction = ledger_setting("LOW_HEADROOM_FRACTION", 0.1)
    for hid, hold in holds.items():
        room = headroom(slots.get(hid, []), now=now) if hid in active else 0
        uncaptured = hold.usage - hold.captured
        if hid in capturing or hid not in active:
            overrun = uncaptured  # captured what it could: the rest found no room
        else:  # the live usage not yet captured takes room first
            overrun = max(0, uncaptured - room)
            room = max(0, room - uncaptured)
        results[hid] = MeterResult(
            hold_id=hid,
            applied=hid in changed,
            state=hold.state,
            amount=hold.amount,
            usage=hold.usage,
            captured=hold.captured,
            headroom=room,
            overrun=overrun,
            would_run_out=(
                hold.state == HoldState.ACTIVE
                and (overrun > 0 or room <= math.ceil(hold.amount * fraction))
            ),
        )
    return results


def _capture_due(hold: LockedHold, now: datetime, interval: float) -> bool:
    """Whether the hold's live usage is due to be captured: its last capture (or its
    creation) is at least `interval` seconds old."""
    since = hold.metered_at or hold.created_at
    return (now - since).total_seconds() >= interval


def _capture(hold: LockedHold, due: int, slots: dict, changes: Changes, *, now) -> None:
    """Charge `due` new usage, accrued since the last meter, to the hold's allocations."""
    since = hold.metered_at or hold.created_at
    txn = new_id()
    charged = split_capture(due, slots.get(hold.pk, []), since=since, now=max(now, since))
    for slot, amount, until in charged:
        changes.allocation(slot.allocation_id, captured=amount)
        changes.move(
            kind=EntryKind.CAPTURE,
            bucket_id=slot.bucket_id,
            source=Account.HELD,
            target=Account.CAPTURED,
            amount=amount,
            hold_id=hold.pk,
            job_id=hold.job_ref,
            usage_until=until,
            org_id=hold.org_id,
            txn=txn,
        )
        hold.captured += amount
    taken = {slot.allocation_id: amount for slot, amount, _ in charged}
    slots[hold.pk] = [
        Slot(
            s.allocation_id,
            s.bucket_id,
            s.room - taken.get(s.allocation_id, 0),
            s.expires_at,
            s.burn_key,
        )
        for s in slots.get(hold.pk, [])
    ]


def _rank(report: UsageReport) -> tuple:
    # Larger cumulative wins; a report without seq beats a heartbeat of equal usage.
    return (report.cumulative, math.inf if report.seq is None else report.seq)


def _apply_marks(
    tx: LedgerTransaction,
    active: dict,
    reports: list[UsageReport],
    changes: Changes,
    *,
    marks: dict | None,
) -> set:
    """Advance the usage marks; add what is new to hold.usage. Returns the changed holds."""
    if not reports:
        return set()
    if marks is None:
        marks = _marks_of(tx, reports)
    changed = set()
    for report in reports:
        previous = marks.get((report.hold_id, report.attempt_key))
        if previous is None:
            old_cumulative, accept, seq = 0, True, report.seq or 0
        elif report.seq is None:
            old_cumulative, seq = previous
            accept = report.cumulative > old_cumulative
        else:
            old_cumulative, old_seq = previous
            accept = report.seq > old_seq and report.cumulative > old_cumulative
            seq = report.seq
        if not accept:
            continue
        changes.marks.append((report.hold_id, report.attempt_key, report.cumulative, seq))
        if report.cumulative > old_cumulative:
            active[report.hold_id].usage += report.cumulative - old_cumulative
            changed.add(report.hold_id)
    return changed


def _marks_of(tx: LedgerTransaction, reports: list[UsageReport]) -> dict:
    """{(hold, attempt): (cumulative, seq)} of the reported attempts' marks."""
    rows = tx.query(
        """
        SELECT m.hold_id, m.attempt_key, m.cumulative, m.seq
          FROM ledger_usagemark m
          JOIN unnest(%s::uuid[], %s::text[]) AS r(hold_id, attempt_key)
            ON m.hold_id = r.hold_id AND m.attempt_key = r.attempt_key
        """,
        [[r.hold_id for r in reports], [r.attempt_key for r in reports]],
    )
    return {(h, k): (c, s) for h, k, c, s in rows}


def slots_of(tx: LedgerTransaction, hold_ids) -> dict:
    """{hold_id: [Slot]} of every allocation of the holds, with its bucket's expiry."""
    if not hold_ids:
        return {}
    return slots_from_rows(
        tx.query(
            "SELECT a.id, a.hold_id, a.bucket_id, a.amount - a.captured - a.refunded, "
            "b.expires_at, b.kind, b.created_at "
            "FROM ledger_holdallocation a JOIN ledger_bucket b ON b.id = a.bucket_id "
            "WHERE a.hold_id = ANY(%s::uuid[])",
            [list(hold_ids)],
        )
    )


def slots_from_rows(rows) -> dict:
    """Rows of (allocation, hold, bucket, room, expires_at, kind, created_at) as Slots."""
    slots: dict = {}
    for pk, hold_id, bucket_id, room, expires_at, kind, created_at in rows:
        slots.setdefault(hold_id, []).append(
            Slot(
                allocation_id=pk,
                bucket_id=bucket_id,
                room=room,
                expires_at=expires_at,
                burn_key=burn_key(
                    expires_at=expires_at, kind=kind, created_at=created_at, bucket_id=bucket_id
                ),
            )
        )
    return slots
