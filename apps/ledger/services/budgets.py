"""Hierarchical budgets: org → project → user (and user within a project).

A budget caches `held` (amounts of the active holds beneath it) and `consumed` (what
settled holds beneath it captured this period). Reservations and settlements change
the caches inside their single write statement, the last of their transaction (the
org row is the hottest: pgbench measured 540/s when it is locked early and 1,200/s when
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
from django.db.models import F, Q, Sum

from apps.core.clock import db_now
from apps.core.errors import GantryError
from apps.ledger.metrics import count
from apps.ledger.models import Budget, BudgetMode, BudgetPeriod, Hold, HoldState
from apps.ledger.services._statements import Changes
from apps.ledger.services._transaction import BUDGET_EXCEEDED, LANE_FALLBACK, budget_lock_sql
from apps.ledger.services._validation import check_scope, non_negative
from apps.ledger.services.buckets import lane_shares, split_evenly

# The budgets above a hold of (org, project, user), locked in the fixed order org →
# project → user (→ user within project), then by id, by the write statement itself,
# after the org's shared budget lock was taken by an earlier statement; then updated in
# one UPDATE, whose row locks are already held. {now} is the write's instant (the
# database clock); the consumed figure of a month budget restarts at each calendar month
# (UTC). {lanes} narrows the scope to the hold's own lane of each budget, or not at all.
_LEVEL = "(b.project_id IS NOT NULL)::int + 2 * (b.user_id IS NOT NULL)::int"
_IN_SCOPE = """b.org_id = %(g_org)s
   AND (b.project_id IS NULL OR b.project_id = %(g_project)s)
   AND (b.user_id IS NULL OR b.user_id = %(g_user)s)"""
_OWN_LANE = "b.lane = %(g_lane)s %% b.lanes"


def _month(now: str) -> str:
    return f"date_trunc('month', {now}, 'UTC')"


def _period_consumed(alias: str, now: str = "{now}") -> str:
    """A lane's consumed figure in the current period (0 once a month budget's month is
    over)."""
    return (
        f"CASE WHEN {alias}.period = 'month' AND {alias}.period_start < {_month(now)} "
        f"THEN 0 ELSE {alias}.consumed END"
    )


_PERIOD_START = (
    f"CASE WHEN b.period = 'month' THEN greatest(b.period_start, {_month('{now}')}) "
    "ELSE b.period_start END"
)

# The hold's own lane of every budget in scope, charged while that lane stays within its
# share and no lane of the budget is over its share; a budget that cannot be charged so
# is left to the complete statement (or refused, if it has one lane).
_LANE_SCOPE = f"""
SELECT b.id, coalesce(b.lane_of_id, b.id) AS budget, b.org_id, b.project_id, b.user_id,
       b.held, b.consumed, b."limit", b.lanes
  FROM ledger_budget b
 WHERE {_IN_SCOPE} AND {_OWN_LANE}
 ORDER BY {_LEVEL}, b.id
   FOR NO KEY UPDATE
"""
_LANE_CHARGE = f"""
UPDATE ledger_budget AS b
   SET consumed = {_period_consumed("b")}, period_start = {_PERIOD_START},
       held = b.held + %(g_amount)s, updated_at = {{now}}
  FROM gb
 WHERE b.id = gb.id AND {{guard}}
   AND (b.mode = 'soft'
        OR (NOT b.unbalanced AND b.held + %(g_amount)s + {_period_consumed("b")} <= b.share))
RETURNING b.id, gb.budget, b.org_id, b.mode, b."limit", b.held, b.consumed
"""
# Soft budgets that the reservation took over their limit get an alert, in the same
# statement: the charged lane as written, the budget's other lanes as they were.
_LANE_ALERTS = f"""
INSERT INTO ledger_budgetalert (budget_id, org_id, hold_id, amount, "limit", held, consumed,
                                created_at)
SELECT u.budget, u.org_id, %(g_hold)s, %(g_amount)s, u."limit",
       u.held + coalesce(sum(o.held), 0), u.consumed + coalesce(sum({_period_consumed("o")}), 0),
       {{now}}
  FROM ug u
  LEFT JOIN ledger_budget o ON coalesce(o.lane_of_id, o.id) = u.budget AND o.id <> u.id
 WHERE u.mode = 'soft'
 GROUP BY u.id, u.budget, u.org_id, u."limit", u.held, u.consumed
HAVING u.held + coalesce(sum(o.held), 0)
       + u.consumed + coalesce(sum({_period_consumed("o")}), 0) > u."limit"
RETURNING 1
"""

# Every lane of every budget in scope: a hard budget is charged if the whole budget stays
# within its limit; the hold's own lane takes the amount and each lane is marked
# unbalanced while any lane of its budget is over its share.
_ALL_LANES_SCOPE = f"""
SELECT b.id, coalesce(b.lane_of_id, b.id) AS budget, b.org_id, b.project_id, b.user_id,
       b.lane, b.lanes, b.held, {_period_consumed("b")} AS consumed, b.share, b."limit",
       b.mode
  FROM ledger_budget b
 WHERE {_IN_SCOPE}
 ORDER BY {_LEVEL}, b.id
   FOR NO KEY UPDATE
"""
_ALL_LANES_TOTALS = """
SELECT g.budget, sum(g.held) AS held, sum(g.consumed) AS consumed,
       bool_or(g.held + g.consumed
               + CASE WHEN g.lane = %(g_lane)s %% g.lanes THEN %(g_amount)s ELSE 0 END
               > g.share) AS over
  FROM gb g GROUP BY g.budget
"""
_ALL_LANES_CHARGE = f"""
UPDATE ledger_budget AS b
   SET consumed = {_period_consumed("b")}, period_start = {_PERIOD_START},
       held = b.held + CASE WHEN b.lane = %(g_lane)s %% b.lanes THEN %(g_amount)s ELSE 0 END,
       unbalanced = b.mode = 'hard' AND t.over, updated_at = {{now}}
  FROM gb JOIN gt t ON t.budget = gb.budget
 WHERE b.id = gb.id AND {{guard}}
   AND (b.mode = 'soft' OR t.held + t.consumed + %(g_amount)s <= b."limit")
RETURNING b.id, gb.budget, b.org_id, b.mode, b."limit"
"""
_ALL_LANES_ALERTS = """
INSERT INTO ledger_budgetalert (budget_id, org_id, hold_id, amount, "limit", held, consumed,
                                created_at)
SELECT DISTINCT u.budget, u.org_id, %(g_hold)s, %(g_amount)s, u."limit",
       t.held + %(g_amount)s, t.consumed, {now}
  FROM ug u JOIN gt t ON t.budget = u.budget
 WHERE u.mode = 'soft' AND t.held + t.consumed + %(g_amount)s > u."limit"
RETURNING 1
"""

_DISCHARGE = f"""
UPDATE ledger_budget AS b
   SET consumed = {_period_consumed("b")} + %(g_captured)s, period_start = {_PERIOD_START},
       held = b.held - %(g_amount)s, updated_at = {{now}}
  FROM gb
 WHERE b.id = gb.id AND {{guard}}
RETURNING b.id
"""

_SCOPE_LABEL = (
    "concat_ws(' / ', 'org ' || g.org_id, 'project ' || g.project_id, 'user ' || g.user_id)"
)
# A one-lane budget refused by the lane statement (its lane is the whole budget).
_LANE_EXCEEDED_MESSAGE = f"""(SELECT format(
    'The hard budget of %%s would be exceeded: %%s µc held + %%s µc consumed + '
    || '%%s µc requested > limit %%s µc.',
    {_SCOPE_LABEL}, g.held, g.consumed, %(g_amount)s, g."limit")
  FROM gb g WHERE g.id NOT IN (SELECT id FROM ug) AND g.lanes = 1 LIMIT 1)"""
_ALL_LANES_EXCEEDED_MESSAGE = f"""(SELECT format(
    'The hard budget of %%s would be exceeded: %%s µc held + %%s µc consumed + '
    || '%%s µc requested > limit %%s µc.',
    {_SCOPE_LABEL}, t.held, t.consumed, %(g_amount)s, g."limit")
  FROM gb g JOIN gt t ON t.budget = g.budget
 WHERE g.budget NOT IN (SELECT budget FROM ug) LIMIT 1)"""


def statement_parts(*, charge: bool, guard: str, now: str, lanes: str = "own") -> tuple:
    """The CTEs that charge (or discharge) the budgets above a hold inside a write
    statement, and the checks that refuse the statement: [(condition, SQLSTATE, message)].

    `guard` is the SQL condition of the statement's writes, `now` its instant (SQL).
    `lanes`: "own" charges the hold's own lane of each budget (the fast statement: a
    budget it cannot charge so raises LANE_FALLBACK, or BudgetExceeded if the budget has
    one lane), "all" locks every lane and checks the whole limit. A discharge always
    goes to the hold's own lane, the one its reservation charged.
    Parameters: g_org, g_project, g_user, g_amount, g_lane, and g_hold (charge) or
    g_captured.
    """
    fill = {"{guard}": guard, "{now}": now}

    def sql(template: str) -> str:
        for marker, value in fill.items():
            template = template.replace(marker, value)
        return template

    if not charge:
        return [("gb", sql(_LANE_SCOPE)), ("ug", sql(_DISCHARGE))], []
    if lanes == "all":
        parts = [
            ("gb", sql(_ALL_LANES_SCOPE)),
            ("gt", _ALL_LANES_TOTALS),
            ("ug", sql(_ALL_LANES_CHARGE)),
            ("ga", sql(_ALL_LANES_ALERTS)),
        ]
        checks = [
            (
                f"NOT {guard} OR (SELECT count(*) FROM ug) = (SELECT count(*) FROM gb)",
                BUDGET_EXCEEDED,
                _ALL_LANES_EXCEEDED_MESSAGE,
            )
        ]
        return parts, checks
    parts = [("gb", sql(_LANE_SCOPE)), ("ug", sql(_LANE_CHARGE)), ("ga", sql(_LANE_ALERTS))]
    checks = [
        (
            f"NOT {guard} OR NOT EXISTS "
            "(SELECT 1 FROM gb WHERE lanes = 1 AND id NOT IN (SELECT id FROM ug))",
            BUDGET_EXCEEDED,
            _LANE_EXCEEDED_MESSAGE,
        ),
        (
            f"NOT {guard} OR (SELECT count(*) FROM ug) = (SELECT count(*) FROM gb)",
            LANE_FALLBACK,
            "'a lane of a budget cannot take this hold'",
        ),
    ]
    return parts, checks


def charge(
    changes: Changes, *, hold_id, org_id, project_id, user_id, amount: int, lane: int
) -> None:
    """Count `amount` more held against every budget above the hold (on the hold's own
    lane of each, checking each budget's whole limit), in the write statement of
    `changes`.

    A hard budget that would go over makes the statement raise (BudgetExceeded once
    mapped by services._transaction.refused): the transaction rolls back, nothing is held. A
    soft one is allowed and an alert recorded.
    """
    parts, checks = statement_parts(charge=True, guard=changes.guard, now="%(g_now)s", lanes="all")
    params = {
        "g_org": org_id,
        "g_project": project_id,
        "g_user": user_id,
        "g_amount": amount,
        "g_hold": hold_id,
        "g_lane": lane,
        "g_now": changes.at,
    }
    changes.tail += [(name, sql, params, ()) for name, sql in parts]
    changes.checks += checks


def discharge(
    changes: Changes, *, org_id, project_id, user_id, amount: int, captured: int, lane: int
):
    """Move a closing hold of `amount` that captured `captured` from held to consumed in
    the lane of every budget above it that its reservation charged, in the write
    statement of `changes`."""
    parts, _checks = statement_parts(charge=False, guard=changes.guard, now="%(g_now)s")
    params = {
        "g_org": org_id,
        "g_project": project_id,
        "g_user": user_id,
        "g_amount": amount,
        "g_captured": captured,
        "g_lane": lane,
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

    A limit of at least twice GANTRY_LEDGER_LANE_MIN gets lanes (see Budget.lane_of),
    fixed when the budget is created. Returns its first lane (selectors.budget_totals
    adds the lanes up). Idempotent: the same call twice leaves the same budget.
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
        current = Budget.objects.filter(org=org, project=project, user=user, lane=0).first()
        # A budget keeps the lanes it was created with (its holds know their lane by it).
        lanes = current.lanes if current is not None else len(lane_shares(limit))
        shares = split_evenly(limit, lanes)
        held, consumed = _usage_by_lane(
            org=org, project=project, user=user, lanes=lanes, period_start=period_start
        )
        unbalanced = mode == BudgetMode.HARD and any(
            held[n] + consumed[n] > shares[n] for n in range(lanes)
        )
        budget = None
        for n in range(lanes):
            row, _created = Budget.objects.update_or_create(
                org=org,
                project=project,
                user=user,
                lane=n,
                defaults={
                    "lane_of": budget,
                    "lanes": lanes,
                    "limit": limit,
                    "share": shares[n],
                    "unbalanced": unbalanced,
                    "period": period,
                    "mode": mode,
                    "held": held[n],
                    "consumed": consumed[n],
                    "period_start": period_start,
                    "updated_at": now,
                },
            )
            budget = budget or row
    count("set_budget")
    return budget


def _usage_by_lane(*, org, project, user, lanes: int, period_start) -> tuple[list, list]:
    """Held (active holds' amounts) and consumed (closed holds' captures this period) of
    the holds in scope, by lane (hold.lane % lanes)."""
    scope = Q(org=org)
    if project is not None:
        scope &= Q(project=project)
    if user is not None:
        scope &= Q(user=user)
    closed = ~Q(state=HoldState.ACTIVE)
    if period_start is not None:
        closed &= Q(settled_at__gte=period_start)
    rows = (
        Hold.objects.filter(scope)
        .annotate(budget_lane=F("lane") % lanes)
        .values("budget_lane")
        .annotate(
            held=Sum("amount", filter=Q(state=HoldState.ACTIVE), default=0),
            consumed=Sum("captured", filter=closed, default=0),
        )
    )
    held, consumed = [0] * lanes, [0] * lanes
    for row in rows:
        held[row["budget_lane"]] = row["held"]
        consumed[row["budget_lane"]] = row["consumed"]
    return held, consumed


def _month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
