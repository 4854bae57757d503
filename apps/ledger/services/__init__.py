"""The ledger's service API: the only code that moves money.

Every function takes keyword-only options and states its guarantee in its docstring.
Amounts are integer micro-credits. Errors are apps.core.errors exceptions:
GantryError (400, invalid input, names the field), InsufficientCredits (402),
BudgetExceeded (403), Conflict (409: idempotency key reused differently, closed hold).
"""

from apps.ledger.services.buckets import adjust, expire_buckets, grant
from apps.ledger.services.budgets import set_budget
from apps.ledger.services.holds import ReservationRetry, extend, reserve
from apps.ledger.services.metering import MeterResult, meter
from apps.ledger.services.reconcile import Violation, reconcile
from apps.ledger.services.settlement import SettleResult, expire_stale_holds, release, settle
from apps.ledger.services.usage_batch import (
    fold_usage_reports,
    pending_usage_reports,
    record_usage,
)

__all__ = [
    "MeterResult",
    "ReservationRetry",
    "SettleResult",
    "Violation",
    "adjust",
    "expire_buckets",
    "expire_stale_holds",
    "extend",
    "fold_usage_reports",
    "grant",
    "meter",
    "pending_usage_reports",
    "reconcile",
    "record_usage",
    "release",
    "reserve",
    "set_budget",
    "settle",
]
