"""Holds: reserve credit for a job and extend it (settlement.py closes it).

Lock order, everywhere: the hold, then buckets by id, then budgets org → project → user
as the last rows the transaction touches. No SERIALIZABLE: row locks and guarded
updates make every race explicit. A reserve is one statement (one round trip with
BEGIN, the budget lock and COMMIT), see services._transaction.
"""

# SQL here is composed only of this package's own constant fragments; values are
# always bound parameters.
# ruff: noqa: S608

from __future__ import annotations

import uuid
import weakref
from datetime import datetime

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

from apps.core.clock import db_now
from apps.core.errors import Conflict, GantryError, InsufficientCredits
from apps.core.ids import new_id
from apps.core.memo import ProcessMemo
from apps.ledger.allocation import BURN_ORDER_SQL, Source, burn_key, plan_draw
from apps.ledger.metrics import count, count_budget_alerts
from apps.ledger.models import Account, EntryKind, Hold, HoldState
from apps.ledger.services import budgets
from apps.ledger.services._statements import Changes, flush, refused_by_budget
from apps.ledger.services._transaction import (
    BUDGETS_EXIST,
    INSUFFICIENT_CREDITS,
    LANE_FALLBACK,
    LedgerTransaction,
    budget_lock_sql,
    has_budget_sql,
    ledger_setting,
)
from apps.ledger.services._validation import check_scope, key_or_error, positive_amount
from apps.ledger.services.metering import (
    lock_holds,
)

DEFAULT_HOLD_TTL_S = 24 * 3600


# Every eligible bucket with credit, locked in id order, read with the database time;
# the same statement takes the org's shared budget lock (see services.budgets). For an
# extension, also the hold's existing allocation in each bucket.
_LOCK_SOURCES = f"""
SELECT b.id, b.kind, b.expires_at, b.created_at,
       b.granted - b.consumed - b.held - b.expired, a.id, statement_timestamp(),
       {budget_lock_sql("%(org)s::text")}
  FROM ledger_bucket b
  LEFT JOIN ledger_holdallocation a ON a.bucket_id = b.id AND a.hold_id = %(hold)s
 WHERE b.org_id = %(org)s
   AND (b.project_id IS NULL OR b.project_id = %(project)s)
   AND (b.expires_at IS NULL OR b.expires_at > statement_timestamp())
   AND b.granted - b.consumed - b.held - b.expired > 0
 ORDER BY b.id
   FOR NO KEY UPDATE OF b
"""


# A reservation is one statement, sent in one round trip with BEGIN, the org's shared
# budget lock (a statement of its own, so that this one's snapshot comes after it) and
# COMMIT: the buckets are locked only while it runs. It locks the eligible funded buckets
# in id order, draws in burn order (allocation.BURN_ORDER_SQL: expires_at with never-
# expiring last, promo < grant < paid, created_at, id), inserts the hold unless its key exists,
# and (only then) the allocations, entries, bucket caches and budgets.
#
# Lanes (Bucket.lane_of): the lanes of one grant are one rank, and a reservation locks
# only one of them, the first funded lane at or after the session's lane number, so
# that concurrent holds of one org draw side by side. {sources} is that choice in the
# fast statement and every eligible funded bucket in the complete one. The fast one
# draws nothing and raises LANE_FALLBACK when its lanes cannot serve the hold in burn
# order although the org may have the credit (a chosen lane ran dry, or another lane of
# a higher-ranked grant has funds); the caller then runs the complete statement.
#
# The budget rows are the org's hottest (every hold of the org touches them): the final
# SELECT reads the allocation, entry and bucket writes first, so that the budget CTEs
# run last and their row locks are held only from there to the commit.
#
# Most orgs have no budget, and the budget CTEs cost a reservation a tenth of its
# PostgreSQL CPU even with no row to read (their plan nodes are set up on every
# execution). So each statement also comes without them, for an org this process has not
# seen with budgets lately: that one checks instead that the org has none (one index
# probe, under the org's shared budget lock, so set_budget cannot create one meanwhile)
# and raises BUDGETS_EXIST, writing nothing, if it has; the caller then sends the
# statement with the budgets. No refusal of the statement without them can hide that one.
_RESERVE = """
WITH cand AS (
    SELECT b.id, b.lane, coalesce(b.lane_of_id, b.id) AS grp,
           coalesce(b.expires_at, 'infinity') AS exp, b.kind_rank, b.created_at,
           b.granted - b.consumed - b.held - b.expired AS available
      FROM ledger_bucket b
     WHERE b.org_id = %(org)s
       AND (b.project_id IS NULL OR b.project_id = %(project)s)
       AND (b.expires_at IS NULL OR b.expires_at > statement_timestamp())
       AND b.granted - b.consumed - b.held - b.expired > 0
), pick AS (
    {sources}
), src AS (
    SELECT b.id, coalesce(b.lane_of_id, b.id) AS grp, coalesce(b.expires_at, 'infinity') AS exp,
           b.kind_rank, b.created_at, b.granted - b.consumed - b.held - b.expired AS available
      FROM ledger_bucket b
     WHERE b.id IN (SELECT id FROM pick)
       AND (b.expires_at IS NULL OR b.expires_at > statement_timestamp())
       AND b.granted - b.consumed - b.held - b.expired > 0
     ORDER BY b.id
       FOR NO KEY UPDATE OF b
), burn AS (
    SELECT id, grp, exp, kind_rank, created_at, available,
           sum(available) OVER (ORDER BY {burn_order}, grp, id) AS upto
      FROM src
), plan AS (
    SELECT id, grp, exp, kind_rank, created_at,
           least(available, %(amount)s - (upto - available)) AS part, upto
      FROM burn WHERE upto - available < %(amount)s
), last AS (
    SELECT grp, exp, kind_rank, created_at FROM plan ORDER BY upto DESC LIMIT 1
), enough AS (
    SELECT coalesce(sum(part), 0) = %(amount)s AS ok FROM plan
), in_order AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM cand c, last l
         WHERE c.id NOT IN (SELECT id FROM pick) AND c.grp <> l.grp
           AND ({burn_order_of_c}, c.grp) < ({burn_order_of_l}, l.grp)
    ) AS ok
), nb AS (
    {budget_probe}
), drawn AS (
    SELECT (SELECT ok FROM enough) AND (SELECT ok FROM in_order) AS ok
), hi AS (
    INSERT INTO ledger_hold (id, org_id, project_id, user_id, job_ref, requested_amount,
                             amount, captured, refunded, usage, state, idempotency_key,
                             expires_at, reason, created_at, lane)
    SELECT %(hold)s, %(org)s, %(project)s, %(user)s, %(job)s, %(amount)s, %(amount)s, 0, 0, 0,
           'active', %(key)s, e.at, '', statement_timestamp(), %(lane)s
      FROM (SELECT coalesce(%(expires_at)s::timestamptz,
                            statement_timestamp() + %(ttl)s * interval '1 second') AS at) e
     WHERE (SELECT ok FROM drawn) AND (SELECT ok FROM nb) AND e.at > statement_timestamp()
    ON CONFLICT (org_id, idempotency_key) DO NOTHING
    RETURNING expires_at
), na AS (
    INSERT INTO ledger_holdallocation (hold_id, bucket_id, amount, captured, refunded)
    SELECT %(hold)s, id, part, 0, 0 FROM plan WHERE EXISTS (SELECT 1 FROM hi)
    RETURNING 1
), e AS (
    INSERT INTO ledger_entry (txn, org_id, bucket_id, account, counter_account, amount, kind,
                              hold_id, job_id, idempotency_key, usage_until, memo, created_at)
    SELECT %(txn)s, %(org)s, p.id, leg.account, leg.counter, leg.amount, 'hold', %(hold)s,
           %(job)s, %(key)s, NULL, 'reserve', statement_timestamp()
      FROM plan p
     CROSS JOIN LATERAL (VALUES ('available', 'held', -p.part), ('held', 'available', p.part))
           AS leg(account, counter, amount)
     WHERE EXISTS (SELECT 1 FROM hi)
     ORDER BY p.upto, leg.amount
    RETURNING 1
), ub AS (
    UPDATE ledger_bucket AS b SET held = b.held + p.part
      FROM plan p
     WHERE b.id = p.id AND EXISTS (SELECT 1 FROM hi)
    RETURNING 1
), {budgets}
SELECT statement_timestamp(), (SELECT coalesce(sum(available), 0) FROM cand),
       (SELECT expires_at FROM hi),
       (SELECT count(*) FROM na) + (SELECT count(*) FROM e) + (SELECT count(*) FROM ub),
       (SELECT count(*) FROM ga),
       {lane_fallback},
       CASE WHEN NOT (SELECT ok FROM drawn) AND NOT {falls_back} AND (SELECT ok FROM nb)
                 AND NOT EXISTS (SELECT 1 FROM ledger_hold
                                  WHERE org_id = %(org)s AND idempotency_key = %(key)s)
            THEN ledger_raise('{insufficient}', format(
                'Not enough credit: %%s µc available, %%s µc requested.',
                (SELECT coalesce(sum(available), 0) FROM cand), %(amount)s)) END,
       {budget_checks}
"""

# The fast statement's sources: one lane of each grant, the first funded one at or after
# the hold's lane number (among the grant's lanes, cyclically).
_ONE_LANE_EACH = """
    SELECT DISTINCT ON (grp) id
      FROM (SELECT id, grp, lane, max(lane) OVER (PARTITION BY grp) + 1 AS n FROM cand) c
     ORDER BY grp, (lane - %(lane)s %% n + n) %% n
"""
_EVERY_BUCKET = "SELECT id FROM cand"
# The fast statement falls back when its lanes drew nothing although the org may have
# the credit; otherwise a reservation that drew nothing (and whose key is new) raises
# INSUFFICIENT_CREDITS, so that no statement sent after it in its round trip runs.
_FALLS_BACK = """(NOT (SELECT ok FROM in_order)
               OR (SELECT coalesce(sum(available), 0) FROM cand) >= %(amount)s)"""
_FALLBACK = f"""
CASE WHEN NOT (SELECT ok FROM drawn) AND {_FALLS_BACK} AND (SELECT ok FROM nb)
     THEN ledger_raise('{LANE_FALLBACK}', 'the chosen lanes cannot serve this hold') END
"""


# nb: whether the statement may go on as it is. With the budgets' part, always; without
# it, only if the org has no budget (else it writes nothing and raises BUDGETS_EXIST,
# and neither a lane fallback nor a 402 decided without the budgets).
_WITH_BUDGETS_PROBE = "SELECT true AS ok"
_NO_BUDGETS_PROBE = f"SELECT NOT {has_budget_sql('%(org)s')} AS ok"
_NO_BUDGETS = "ga AS (SELECT 1 WHERE false)"  # no budget alerts to count
_NO_BUDGETS_CHECK = (
    f"CASE WHEN NOT (SELECT ok FROM nb) THEN ledger_raise('{BUDGETS_EXIST}', "
    "'the org has budgets: reserve with them') END"
)


def _reserve_sql(sources: str, *, lanes: str, lane_fallback: str, with_budgets: bool) -> str:
    if with_budgets:
        guard = "EXISTS (SELECT 1 FROM hi)"
        parts, checks = budgets.statement_parts(
            charge=True, guard=guard, now="statement_timestamp()", lanes=lanes
        )
        ctes = ",\n".join(f"{name} AS ({sql})" for name, sql in parts)
        refusals = ",\n".join(
            f"CASE WHEN NOT ({ok}) THEN ledger_raise('{code}', {message}) END"
            for ok, code, message in checks
        )
        probe = _WITH_BUDGETS_PROBE
    else:
        ctes, refusals, probe = _NO_BUDGETS, _NO_BUDGETS_CHECK, _NO_BUDGETS_PROBE
    return (
        _RESERVE.replace("{sources}", sources)
        .replace("{budgets}", ctes)
        .replace("{budget_checks}", refusals)
        .replace("{lane_fallback}", lane_fallback)
        .replace("{falls_back}", _FALLS_BACK if lanes == "own" else "false")
        .replace("{budget_probe}", probe)
        .replace("{insufficient}", INSUFFICIENT_CREDITS)
        .replace("{burn_order}", ", ".join(BURN_ORDER_SQL))
        .replace("{burn_order_of_c}", ", ".join(f"c.{key}" for key in BURN_ORDER_SQL))
        .replace("{burn_order_of_l}", ", ".join(f"l.{key}" for key in BURN_ORDER_SQL))
    )


# The fast statement: one lane of each grant and budget. The complete one: all of them.
# Each with the budgets' part, and without it (see above).
RESERVE_FROM_LANES = _reserve_sql(
    _ONE_LANE_EACH, lanes="own", lane_fallback=_FALLBACK, with_budgets=True
)
RESERVE = _reserve_sql(_EVERY_BUCKET, lanes="all", lane_fallback="NULL", with_budgets=True)
RESERVE_FROM_LANES_NO_BUDGETS = _reserve_sql(
    _ONE_LANE_EACH, lanes="own", lane_fallback=_FALLBACK, with_budgets=False
)
RESERVE_NO_BUDGETS = _reserve_sql(
    _EVERY_BUCKET, lanes="all", lane_fallback="NULL", with_budgets=False
)
# (every lane, with the budgets' part) -> the statement.
_RESERVE_STATEMENTS = {
    (False, False): RESERVE_FROM_LANES_NO_BUDGETS,
    (True, False): RESERVE_NO_BUDGETS,
    (False, True): RESERVE_FROM_LANES,
    (True, True): RESERVE,
}
BUDGET_LOCK = f"SELECT {budget_lock_sql('%(org)s::text')}"


def reserve(
    *,
    org,
    amount: int,
    idempotency_key: str,
    project=None,
    user=None,
    expires_at: datetime | None = None,
    job_id: uuid.UUID | None = None,
    hold_id: uuid.UUID | None = None,
    savepoint: bool = True,
    then: tuple = (),
    last: bool = False,
) -> Hold:
    """Hold `amount` micro-credits of the org for one job.

    Draws from the eligible buckets in burn order (ledger invariant 6 in
    docs/architecture.md; only buckets unexpired by the database clock whose project scope
    matches, org-wide ones always) and records the split in HoldAllocation rows. Then counts
    it against the budgets org → project → user: a hard budget that would be exceeded raises
    BudgetExceeded and nothing is held; a soft one is allowed and an alert recorded. Raises
    InsufficientCredits (402) when less than `amount` is available.

    The same idempotency key returns the same hold (also under concurrent callers;
    never a second one); the same key with another amount, project or user raises
    Conflict. `expires_at` (default: GANTRY_LEDGER_HOLD_TTL_S from now) is when the
    recovery task may settle the hold if no settle ever comes. `job_id` tags the
    hold's entries with the job; `hold_id` (default: a new one) is the new hold's id.

    Inside the caller's transaction, the reservation is a savepoint of it, which an
    error rolls back. With `savepoint=False` it is not, for a caller whose transaction
    fails with it: an error then aborts the caller's transaction (its atomic block rolls
    it back), and ReservationRetry asks for the whole transaction to be run again.
    `then`: the caller's (sql, params) statements, sent after the reservation in its
    round trip; a refusal (402, 403) keeps them from running, but a replay (the key is
    taken: nothing new held) does not, so a caller whose key may already hold must not
    send them. `last`: nothing follows in the caller's atomic block, so its COMMIT goes
    in that round trip too (see LedgerTransaction).
    """
    positive_amount(amount)
    key_or_error(idempotency_key)
    check_scope(org=org, project=project, user=user)
    project_id, user_id = getattr(project, "pk", None), getattr(user, "pk", None)
    request = (amount, project_id, user_id)
    hold_id = hold_id or new_id()
    lane = preferred_lane()
    params = {
        "hold": hold_id,
        "org": org.pk,
        "project": project_id,
        "user": user_id,
        "job": job_id,
        "amount": amount,
        "key": idempotency_key,
        "expires_at": expires_at,
        "ttl": ledger_setting("HOLD_TTL_S", DEFAULT_HOLD_TTL_S),
        "txn": new_id(),
        "g_org": org.pk,
        "g_project": project_id,
        "g_user": user_id,
        "g_amount": amount,
        "g_hold": hold_id,
        "lane": lane,
        "g_lane": lane,
    }
    try:
        now, hold_expires_at, alerts = _draw_in_lanes(
            org.pk, params=params, savepoint=savepoint, then=then, last=last
        )
    except psycopg.Error as error:
        if error.sqlstate != INSUFFICIENT_CREDITS:
            raise refused_by_budget(error, op="reserve") from error
        if (savepoint or _owns_transaction()) and _key_taken(org, idempotency_key):
            # A caller with this key held the last credit and committed while this one
            # waited for the buckets (the statement's snapshot could not see its hold):
            # that hold, never a second.
            return _replay(org, idempotency_key, request)
        count("reserve", "insufficient_credits")
        raise InsufficientCredits(error.diag.message_primary, field="amount") from error
    if hold_expires_at is None:  # nothing was written: the key is taken, or expires_at past
        if _key_taken(org, idempotency_key):
            # Possibly by a caller that committed while this one waited on the unique
            # index: that hold, never a second.
            return _replay(org, idempotency_key, request)
        raise GantryError("expires_at must be in the future.", code="invalid", field="expires_at")
    count_budget_alerts(alerts)
    count("reserve")
    hold = Hold(
        id=hold_id,
        org=org,
        project=project,
        user=user,
        job_ref=job_id,
        requested_amount=amount,
        amount=amount,
        state=HoldState.ACTIVE,
        idempotency_key=idempotency_key,
        expires_at=hold_expires_at,
        created_at=now,
        lane=lane,
    )
    hold._state.adding = False
    hold._state.db = "default"
    return hold


def preferred_lane() -> int:
    """The lane number of this database session: the lane of each grant and budget its
    reservations prefer. Sessions are numbered in the order they first reserve (a
    sequence), so the busy sessions of one org take the lanes in turn; a random number
    per hold, or the backend pid, would make two of them collide often."""
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    pg = db.connection
    lane = _SESSION_LANES.get(pg)
    if lane is None:
        lane = _SESSION_LANES[pg] = pg.execute(SESSION_LANE).fetchone()[0]
    return lane


SESSION_LANE = "SELECT nextval('ledger_session_lane')"
# psycopg connection -> its lane number; forgotten with the connection.
_SESSION_LANES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ReservationRetry(Exception):
    """A reservation without a savepoint could not be made as it was sent (its lanes
    could not serve it, or it went without the budgets' part to an org that has budgets):
    the caller's transaction is aborted; run it again (its reservation is then sent to
    every lane, or with the budgets)."""


# Hints for which reservation statement to send first, never guarantees: each checks.
# An org whose lanes could not serve a hold reserves from all its buckets for a while
# (its lanes are running dry, or a higher-ranked grant's are funded): the fast statement
# would only fail again.
_DRAWING_FROM_EVERY_LANE = ProcessMemo(ttl_s=10.0)
# An org found with budgets is reserved for with the budgets' part for ten minutes, then
# without it again (its budgets may be gone): found anew, it costs one statement more per
# process every ten minutes.
_WITH_BUDGETS = ProcessMemo(ttl_s=600.0)


def _owns_transaction() -> bool:
    return connections[DEFAULT_DB_ALIAS].get_autocommit()


def _key_taken(org, key: str) -> bool:
    return Hold.objects.filter(org=org, idempotency_key=key).exists()


def _draw_in_lanes(org_id, *, params: dict, savepoint: bool, then, last) -> tuple:
    """The fast statement (one lane of each grant and budget) without the budgets' part,
    unless the org's lanes lately could not serve a hold (then the complete statement,
    every lane) or it was lately found with budgets (then with them); sent again as it
    asks when it cannot be made as sent: (now, the hold's expires_at or None, alerts).
    Each retry sends one part more, so there are at most two."""
    draw = {"params": params, "org_id": org_id, "savepoint": savepoint, "then": then, "last": last}
    every_lane = bool(_DRAWING_FROM_EVERY_LANE.get(org_id))
    with_budgets = bool(_WITH_BUDGETS.get(org_id))
    while True:
        try:
            return _draw(_RESERVE_STATEMENTS[every_lane, with_budgets], **draw)
        except psycopg.Error as error:
            if error.sqlstate == LANE_FALLBACK:  # only the fast statement raises it
                count("reserve", "lane_fallback")
                _DRAWING_FROM_EVERY_LANE.put(org_id, True)
                every_lane = True
            elif error.sqlstate == BUDGETS_EXIST:  # only a statement without them does
                count("reserve", "budgets_found")
                _WITH_BUDGETS.put(org_id, True)
                with_budgets = True
            else:
                raise
            # Rolled back: nothing held, no lock kept.
            if not (savepoint or _owns_transaction()):  # the caller's transaction is aborted
                raise ReservationRetry from error


def _draw(statement: str, *, params: dict, org_id, savepoint: bool, then, last) -> tuple:
    """Run one reservation statement in its own transaction (or savepoint)."""
    with LedgerTransaction(savepoint=savepoint) as tx:
        now, _available, hold_expires_at, _written, alerts, *_checks = tx.write(
            statement, params, first=[(BUDGET_LOCK, {"org": org_id})], then=then, last=last
        )
    return now, hold_expires_at, alerts


def _replay(org, key: str, request: tuple) -> Hold:
    existing = Hold.objects.get(org=org, idempotency_key=key)
    if (existing.requested_amount, existing.project_id, existing.user_id) != request:
        count("reserve", "conflict")
        raise Conflict(
            "This idempotency key was used for a different reservation.",
            code="idempotency_mismatch",
            field="idempotency_key",
        )
    count("reserve", "replay")
    return existing


def _lock_sources(tx: LedgerTransaction, *, hold_id, org_id, project_id) -> tuple[list, datetime]:
    """Lock the eligible buckets with credit in id order: [(Source, allocation id)], now.

    Every eligible funded bucket is locked, so the burn order is exact: no lower-ranked
    bucket is drawn while a higher-ranked one has funds (ledger invariant 6, docs/architecture.md).
    """
    rows = tx.query(_LOCK_SOURCES, {"hold": hold_id, "org": org_id, "project": project_id})
    sources = [
        (
            Source(
                bucket_id=pk,
                available=available,
                burn_key=burn_key(
                    expires_at=expires_at, kind=kind, created_at=created_at, bucket_id=pk
                ),
            ),
            allocation_id,
        )
        for pk, kind, expires_at, created_at, available, allocation_id, _now, _lock in rows
    ]
    return sources, (rows[0][6] if rows else db_now())


def _plan(sources: list, *, amount: int, op: str) -> list[tuple]:
    """Draw `amount` in burn order, or raise InsufficientCredits (402)."""
    plan = plan_draw([source for source, _ in sources], amount)
    if not plan:
        count(op, "insufficient_credits")
        raise InsufficientCredits(
            f"Not enough credit: {sum(s.available for s, _ in sources)} µc available, "
            f"{amount} µc requested.",
            field="amount",
        )
    return plan


def _hold_moves(changes: Changes, plan, sources, *, hold_id, job_id, key, memo) -> None:
    existing = {source.bucket_id: allocation_id for source, allocation_id in sources}
    for bucket_id, part in plan:
        if existing[bucket_id] is None:
            changes.new_allocations.append((hold_id, bucket_id, part))
        else:
            changes.allocation(existing[bucket_id], amount=part)
        changes.move(
            kind=EntryKind.HOLD,
            bucket_id=bucket_id,
            source=Account.AVAILABLE,
            target=Account.HELD,
            amount=part,
            hold_id=hold_id,
            job_id=job_id,
            idempotency_key=key,
            memo=memo,
        )


def extend(hold, *, amount: int, expires_at: datetime | None = None) -> Hold:
    """Top up an active hold by `amount` (long jobs), drawn in burn order like reserve.

    Counted against the budgets like a reservation (hard: BudgetExceeded, nothing
    added). Raises InsufficientCredits if the credit is not there and Conflict if the
    hold is no longer active. `expires_at`, if later than the hold's, pushes back when
    the recovery task may reclaim it. Not idempotent: a retried extend holds more,
    which settlement returns.
    """
    positive_amount(amount)
    with LedgerTransaction() as tx:
        holds, _now, _marks = lock_holds(tx, [hold.pk])
        locked = holds[hold.pk]
        if locked.state != HoldState.ACTIVE:
            count("extend", "conflict")
            raise Conflict(
                f"Hold {locked.pk} is {locked.state}; it cannot be extended.",
                code="hold_closed",
                field="hold",
            )
        sources, now = _lock_sources(
            tx, hold_id=locked.pk, org_id=locked.org_id, project_id=locked.project_id
        )
        plan = _plan(sources, amount=amount, op="extend")
        changes = Changes(at=now, org_id=locked.org_id)
        _hold_moves(
            changes,
            plan,
            sources,
            hold_id=locked.pk,
            job_id=locked.job_ref,
            key=locked.idempotency_key,
            memo="extend",
        )
        changes.hold(locked.pk, amount_delta=amount, expires_at=expires_at)
        budgets.charge(
            changes,
            hold_id=locked.pk,
            org_id=locked.org_id,
            project_id=locked.project_id,
            user_id=locked.user_id,
            amount=amount,
            lane=locked.lane,
        )
        flush(changes, tx, op="extend")
    count_budget_alerts(changes.counts.get("ga", 0))
    count("extend")
    hold.refresh_from_db()
    return hold
