"""Pure arithmetic of the ledger: burn order, drawing a hold, splitting a capture.

No Django and no I/O here, so the rules can be read (and property-tested) on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# The burn order, defined here once (the ledger's invariant 6): the bucket that expires
# first is drawn first (never-expiring last), then promo before grant before paid, then
# the oldest, then the id. `burn_key` is it in Python; the statements that draw in the
# database (services.holds) order by BURN_ORDER_SQL, the same keys as columns: `exp`
# (expires_at, 'infinity' when never), `kind_rank` (KIND_RANK, a generated column of the
# bucket) and `created_at`, then their own tie-breaks. tests/ledger/test_properties.py
# checks that the SQL and burn_key draw the same buckets.
KIND_RANK = {"promo": 0, "grant": 1, "paid": 2}
BURN_ORDER_SQL = ("exp", "kind_rank", "created_at")

# Sorts after every real instant: never-expiring buckets burn last.
_NEVER = (1, datetime.max.replace(tzinfo=UTC))


def burn_key(*, expires_at: datetime | None, kind: str, created_at: datetime, bucket_id) -> tuple:
    """The burn order's sort key: expires_at (never-expiring last), promo < grant < paid,
    created_at, id."""
    expiry = _NEVER if expires_at is None else (0, expires_at)
    return (expiry, KIND_RANK[kind], created_at, bucket_id)


@dataclass(frozen=True)
class Source:
    """A bucket a hold may draw from, with what it has available now."""

    bucket_id: Any
    available: int
    burn_key: tuple


def plan_draw(sources: Iterable[Source], amount: int) -> list[tuple[Any, int]]:
    """Take `amount` from the sources in burn order: [(bucket_id, amount), ...].

    Returns [] when the sources together have less than `amount` (nothing is drawn).
    """
    plan: list[tuple[Any, int]] = []
    left = amount
    for source in sorted(sources, key=lambda s: s.burn_key):
        if left == 0:
            break
        take = min(source.available, left)
        if take > 0:
            plan.append((source.bucket_id, take))
            left -= take
    return plan if left == 0 else []


@dataclass(frozen=True)
class Slot:
    """One allocation of a hold: what it can still capture, and when its bucket expires."""

    allocation_id: Any
    bucket_id: Any
    room: int
    expires_at: datetime | None
    burn_key: tuple


def share_before(total: int, *, instant: datetime, since: datetime, now: datetime) -> int:
    """The part of `total` usage that accrued before `instant`, usage being spread evenly
    over [since, now] (one report window). Deterministic integer arithmetic."""
    if instant <= since:
        return 0
    if instant > now:
        return total
    window_us = _micros(now - since)
    if window_us <= 0:
        return 0
    return total * _micros(instant - since) // window_us


def split_capture(
    total: int, slots: Sequence[Slot], *, since: datetime, now: datetime
) -> list[tuple[Slot, int, datetime]]:
    """Charge `total` usage, accrued over [since, now], to the slots in spend order.

    Ledger invariant 5 (docs/architecture.md): a bucket takes only usage that accrued before
    its expires_at (the window is split at that instant), so nothing is drawn from a bucket
    at or after its expiry. Returns [(slot, amount, usage_until)]; the sum may fall short of
    `total` when the only room left is in buckets that expired inside the window.
    """
    charged: list[tuple[Slot, int, datetime]] = []
    taken = 0
    for slot in sorted(slots, key=lambda s: s.burn_key):
        if taken == total:
            break
        limit = total - taken
        until = now
        if slot.expires_at is not None and slot.expires_at <= now:
            # Slots are in expiry order, so every earlier take accrued before this expiry.
            limit = min(
                limit, share_before(total, instant=slot.expires_at, since=since, now=now) - taken
            )
            until = slot.expires_at
        take = min(slot.room, limit)
        if take > 0:
            charged.append((slot, take, until))
            taken += take
    return charged


def headroom(slots: Iterable[Slot], *, now: datetime) -> int:
    """Room left for future usage: only in allocations whose bucket has not expired."""
    return sum(s.room for s in slots if s.expires_at is None or s.expires_at > now)


def _micros(delta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
