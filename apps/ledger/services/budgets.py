"""Hierarchical budgets: org → project → user (and user within a project).

A budget caches `held` (amounts of the active holds beneath it) and `consumed` (what
settled holds beneath it captured this period). Reservations and settlements change
the caches inside their single write statement, the last of their transaction (the
org row is the hottest: DESIGN measured 540/s when it is locked early and 1,200/s when
it is touched last), locking the rows in the fixed order org → project → user.

Creating or changing a budget recomputes its caches from the holds. So that no
reservation or settlement slips between that computation and its commit, every
transaction that touches budgets takes a shared advisory lock on the org in its first
statement (no extra round trip) and reads the budget rows in a later one (a fresh
snapshot); set_budget takes the lock exclusively. They never interleave, and ordinary
traffic never waits on itself.
"""

# SQL here is composed only of this package's own constant fragments; values are
# always bound parameters.
# ruff: noqa: S608

from __future__ import annotations

from datetime import datetime

from django.db import connection, transaction
from django.db.models import Q, Sum

from apps.api.errors import GantryError
from apps.ledger.metrics import count
from apps.ledger.models import Budget, BudgetMode, BudgetPeriod, Hold, HoldState
from apps.ledger.services._store import (
    BUDGET_EXCEEDED,
    Changes,
    budget_lock_sql,
    check_scope,
    db_now,
    non_negative,
)

# The budgets above a hold of (org, project, user), locked in the fixed order org →
# project → user (→ user within project) by the write statement itself, after the org's
# shared budget lock was taken by an earlier statement; then updated in one UPDATE,
# whose row locks are already held. {now} is the write's instant (the database clock);
# the consumed figure of a month budget restarts at each calendar month (UTC).
_SCOPE = """
SELECT id, org_id, project_id, user_id, held, consumed, "limit", mode
  FROM ledger_budget
 WHERE org_id = %(g_org)s
   AND (project_id IS NULL OR project_id = %(g_project)s)
   AND (user_id IS NULL OR user_id = %(g_user)s)
 ORDER BY (project_id IS NOT NULL)::int + 2 * (user_id IS NOT NULL)::int, id
   FOR NO KEY UPDATE
"""

_MONTH = "date_trunc('month', {now}, 'UTC')"
_PERIOD_CONSUMED = (
    f"CASE WHEN b.period = 'month' AND b.period_start < {_MONTH} THEN 0 ELSE b.consumed END"
)
_PERIOD_START = (
    f"CASE WHEN b.period = 'month' THEN greatest(b.period_start, {_MONTH}) ELSE b.period_start END"
)

# A hard budget's guard is in the WHERE: its row is not updated when the reservation
# would take it over its limit, and the statement then refuses itself.
_CHARGE = f"""
UPDATE ledger_budget AS b
   SET consumed = {_PERIOD_CONSUMED}, period_start = {_PERIOD_START},
       held = b.held + %(g_amount)s, updated_at = {{now}}
  FROM gb
 WHERE b.id = gb.id AND {{guard}}
   AND (b.mode = 'soft' OR b.held + %(g_amount)s + {_PERIOD_CONSUMED} <= b."limit")
RETURNING b.id, b.org_id, b.held, b.consumed, b."limit", b.mode
"""

_DISCHARGE = f"""
UPDATE ledger_budget AS b
   SET consumed = {_PERIOD_CONSUMED} + %(g_captured)s, period_start = {_PERIOD_START},
       held = b.held - %(g_amount)s, updated_at = {{now}}
  FROM gb
 WHERE b.id = gb.id AND {{guard}}
RETURNING b.id
"""

# Soft budgets that the reservation took over their limit get an alert, in the same
# statement.
_ALERTS = """
INSERT INTO ledger_budgetalert (budget_id, org_id, hold_id, amount, "limit", held, consumed,
                                created_at)
SELECT id, org_id, %(g_hold)s, %(g_amount)s, "limit", held, consumed, {now}
  FROM ug
 WHERE mode = 'soft' AND held + consumed > "limit"
RETURNING 1
"""

_EXCEEDED_MESSAGE = """(SELECT format(
    'The hard budget of %%s would be exceeded: %%s µc held + %%s µc consumed + '
    || '%%s µc requested > limit %%s µc.',
    concat_ws(' / ', 'org ' || g.org_id, 'project ' || g.project_id, 'user ' || g.user_id),
    g.held, g.consumed, %(g_amount)s, g."limit")
  FROM gb g WHERE g.id NOT IN (SELECT id FROM ug) LIMIT 1)"""


def statement_parts(*, charge: bool, guard: str, now: str) -> tuple[list, tuple]:
    """The CTEs that charge (or discharge) the budgets above a hold inside a write
    statement, and the check that refuses the statement when a hard budget would go over.

    `guard` is the SQL condition of the statement's writes, `now` its instant (SQL).
    Parameters: g_org, g_project, g_user, g_amount, and g_hold (charge) or g_captured.
    """
    fill = {"{guard}": guard, "{now}": now}

    def sql(template: str) -> str:
        for marker, value in fill.items():
            template = template.replace(marker, value)
        return template

    if not charge:
        return [("gb", _SCOPE), ("ug", sql(_DISCHARGE))], ()
    check = (
        f"NOT {guard} OR (SELECT count(*) FROM ug) = (SELECT count(*) FROM gb)",
        BUDGET_EXCEEDED,
        _EXCEEDED_MESSAGE,
    )
    return [("gb", _SCOPE), ("ug", sql(_CHARGE)), ("ga", sql(_ALERTS))], check


def charge(changes: Changes, *, hold_id, org_id, project_id, user_id, amount: int) -> None:
    """Count `amount` more held against every budget above the hold, in the write
    statement of `changes`.

    A hard budget that would go over makes the statement raise (BudgetExceeded once
    mapped by services._store.refused): the transaction rolls back, nothing is held. A
    soft one is allowed and an alert recorded.
    """
    parts, check = statement_parts(charge=True, guard=changes.guard, now="%(g_now)s")
    params = {
        "g_org": org_id,
        "g_project": project_id,
        "g_user": user_id,
        "g_amount": amount,
        "g_hold": hold_id,
        "g_now": changes.at,
    }
    changes.tail += [(name, sql, params, ()) for name, sql in parts]
    changes.checks.append(check)


def discharge(changes: Changes, *, org_id, project_id, user_id, amount: int, captured: int):
    """Move a closing hold of `amount` that captured `captured` from held to consumed in
    every budget above it, in the write statement of `changes`."""
    parts, _check = statement_parts(charge=False, guard=changes.guard, now="%(g_now)s")
    params = {
        "g_org": org_id,
        "g_project": project_id,
        "g_user": user_id,
        "g_amount": amount,
        "g_captured": captured,
        "g_now": changes.at,
    }
    changes.tail += [(name, sql, params, ()) for name, sql in parts]


def set_budget(
    *,
    org,
    limit: int,
    period: str,
    mode: str,
    project=None,
    user=None,
) -> Budget:
    """Create or change the budget of one scope; its caches are recomputed from the holds.

    Idempotent: the same call twice leaves the same budget.
    """
    non_negative(limit, field="limit")
    if period not in BudgetPeriod.values:
        raise GantryError(
            f"period must be one of {BudgetPeriod.values}.", code="invalid", field="period"
        )
    if mode not in BudgetMode.values:
        raise GantryError(f"mode must be one of {BudgetMode.values}.", code="invalid", field="mode")
    check_scope(org=org, project=project, user=user)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {budget_lock_sql('%s::text', shared=False)}", [org.pk])
        now = db_now()
        period_start = _month_start(now) if period == BudgetPeriod.MONTH else None
        scope = Q(org=org)
        if project is not None:
            scope &= Q(project=project)
        if user is not None:
            scope &= Q(user=user)
        holds = Hold.objects.filter(scope)
        held = holds.filter(state=HoldState.ACTIVE).aggregate(s=Sum("amount"))["s"] or 0
        closed = holds.exclude(state=HoldState.ACTIVE)
        if period_start is not None:
            closed = closed.filter(settled_at__gte=period_start)
        consumed = closed.aggregate(s=Sum("captured"))["s"] or 0
        budget, _created = Budget.objects.update_or_create(
            org=org,
            project=project,
            user=user,
            defaults={
                "limit": limit,
                "period": period,
                "mode": mode,
                "held": held,
                "consumed": consumed,
                "period_start": period_start,
                "updated_at": now,
            },
        )
    count("set_budget")
    return budget


def _month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
