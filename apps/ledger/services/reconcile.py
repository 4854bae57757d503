"""The reconciler: every ledger invariant, checked against the entries.

Each check is one SQL query (one consistent snapshot) returning only violating rows.
Findings are returned, published as the gauge gantry_ledger_reconcile_violations{check}
and recorded as LedgerAuditEvent rows: one open event per (check, subject) while the
violation lasts, resolved when a later run no longer sees it.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models.functions import Now

from apps.ledger.metrics import RECONCILE_LAST_RUN, RECONCILE_RUNS, RECONCILE_VIOLATIONS
from apps.ledger.models import LedgerAuditEvent


@dataclass(frozen=True)
class Violation:
    check: str
    subject: str
    detail: str

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.check}|{self.subject}".encode()).hexdigest()


# check name → (SQL returning (subject, detail) rows, what it guards)
CHECKS: dict[str, tuple[str, str]] = {
    "transaction_unbalanced": (
        """
        SELECT 'txn:' || txn, 'entries sum to ' || sum(amount)
          FROM ledger_entry GROUP BY txn HAVING sum(amount) <> 0
        """,
        "every ledger transaction sums to zero (money is conserved)",
    ),
    "bucket_cache_mismatch": (
        """
        WITH s AS (
            SELECT bucket_id,
                   -coalesce(sum(amount) FILTER (WHERE account = 'issued'), 0) AS granted,
                   coalesce(sum(amount) FILTER (WHERE account IN ('held', 'captured')), 0) AS held,
                   coalesce(sum(amount) FILTER (WHERE account = 'consumed'), 0) AS consumed,
                   coalesce(sum(amount) FILTER (WHERE account = 'expired'), 0) AS expired,
                   coalesce(sum(amount) FILTER (WHERE account = 'available'), 0) AS available
              FROM ledger_entry GROUP BY bucket_id
        )
        SELECT 'bucket:' || b.id,
               format('cached granted/held/consumed/expired/available %%s/%%s/%%s/%%s/%%s, '
                      'entries say %%s/%%s/%%s/%%s/%%s',
                      b.granted, b.held, b.consumed, b.expired,
                      b.granted - b.held - b.consumed - b.expired,
                      s.granted, s.held, s.consumed, s.expired, s.available)
          FROM ledger_bucket b LEFT JOIN s ON s.bucket_id = b.id
         WHERE s.bucket_id IS NULL
            OR (b.granted, b.held, b.consumed, b.expired,
                b.granted - b.held - b.consumed - b.expired)
               <> (s.granted, s.held, s.consumed, s.expired, s.available)
        """,
        "cached bucket balances equal the sums of their entries",
    ),
    "account_negative": (
        """
        SELECT 'bucket:' || bucket_id, account || ' account is ' || sum(amount)
          FROM ledger_entry
         WHERE account <> 'issued'
         GROUP BY bucket_id, account HAVING sum(amount) < 0
        UNION ALL
        SELECT 'bucket:' || id, 'cached columns out of range'
          FROM ledger_bucket
         WHERE consumed < 0 OR held < 0 OR expired < 0 OR consumed + held + expired > granted
        """,
        "no bucket account is ever negative",
    ),
    "hold_inconsistent": (
        """
        WITH a AS (
            SELECT hold_id, sum(amount) AS amount, sum(captured) AS captured,
                   sum(refunded) AS refunded
              FROM ledger_holdallocation GROUP BY hold_id
        ), m AS (
            SELECT hold_id, sum(cumulative) AS usage FROM ledger_usagemark GROUP BY hold_id
        )
        SELECT 'hold:' || h.id,
               format('%%s: amount %%s captured %%s refunded %%s usage %%s; allocations '
                      '%%s/%%s/%%s; marks %%s', h.state, h.amount, h.captured, h.refunded,
                      h.usage, a.amount, a.captured, a.refunded, coalesce(m.usage, 0))
          FROM ledger_hold h
          LEFT JOIN a ON a.hold_id = h.id
          LEFT JOIN m ON m.hold_id = h.id
         WHERE a.hold_id IS NULL
            OR (a.amount, a.captured, a.refunded) <> (h.amount, h.captured, h.refunded)
            OR h.usage <> coalesce(m.usage, 0)
            OR h.captured > h.usage
            OR (h.state = 'active' AND h.refunded <> 0)
            OR (h.state <> 'active' AND h.captured + h.refunded <> h.amount)
        """,
        "settled holds capture + refund their amount; allocations sum to the hold",
    ),
    "allocation_entries_mismatch": (
        """
        WITH e AS (
            SELECT hold_id, bucket_id,
                   coalesce(sum(amount) FILTER (WHERE kind = 'hold' AND account = 'held'), 0)
                       AS reserved,
                   coalesce(sum(amount) FILTER (WHERE kind = 'capture' AND account = 'captured'), 0)
                       AS captured,
                   coalesce(sum(amount) FILTER (WHERE kind IN ('refund', 'release')
                                                  AND account = 'available'), 0) AS refunded,
                   coalesce(sum(amount) FILTER (WHERE account = 'held'), 0) AS held_now,
                   coalesce(sum(amount) FILTER (WHERE account = 'captured'), 0) AS captured_now,
                   coalesce(sum(amount) FILTER (WHERE account = 'consumed'), 0) AS consumed_now
              FROM ledger_entry WHERE hold_id IS NOT NULL GROUP BY hold_id, bucket_id
        )
        SELECT 'hold:' || coalesce(a.hold_id, e.hold_id) || '/bucket:'
                   || coalesce(a.bucket_id, e.bucket_id),
               format('allocation %%s/%%s/%%s (amount/captured/refunded), entries %%s/%%s/%%s, '
                      'now held %%s captured %%s consumed %%s',
                      a.amount, a.captured, a.refunded, e.reserved, e.captured, e.refunded,
                      e.held_now, e.captured_now, e.consumed_now)
          FROM ledger_holdallocation a
          FULL JOIN e ON e.hold_id = a.hold_id AND e.bucket_id = a.bucket_id
          LEFT JOIN ledger_hold h ON h.id = coalesce(a.hold_id, e.hold_id)
         WHERE a.id IS NULL OR e.hold_id IS NULL
            OR (a.amount, a.captured, a.refunded) <> (e.reserved, e.captured, e.refunded)
            OR e.held_now <> a.amount - a.captured - a.refunded
            OR (h.state = 'active' AND (e.captured_now, e.consumed_now) <> (a.captured, 0))
            OR (h.state <> 'active' AND (e.captured_now, e.consumed_now) <> (0, a.captured))
        """,
        "each allocation's hold, capture and refund equal its entries; refunds go back to "
        "the bucket they came from",
    ),
    "entry_org_mismatch": (
        """
        SELECT 'entry:' || e.id, 'entry org ' || e.org_id || ', bucket org ' || b.org_id
          FROM ledger_entry e JOIN ledger_bucket b ON b.id = e.bucket_id
         WHERE e.org_id <> b.org_id
        """,
        "every entry belongs to its bucket's org",
    ),
    "spend_after_expiry": (
        """
        SELECT 'entry:' || e.id,
               format('%%s of %%s on bucket %%s (expires %%s) at %%s, usage until %%s',
                      e.kind, e.amount, b.id, b.expires_at, e.created_at, e.usage_until)
          FROM ledger_entry e JOIN ledger_bucket b ON b.id = e.bucket_id
         WHERE b.expires_at IS NOT NULL AND e.amount > 0
           AND ((e.kind = 'hold' AND e.account = 'held' AND e.created_at >= b.expires_at)
             OR (e.kind = 'capture' AND e.account = 'captured'
                 AND coalesce(e.usage_until, e.created_at) > b.expires_at))
        UNION ALL
        SELECT 'bucket:' || id, 'expired bucket still has ' ||
               (granted - consumed - held - expired) || ' spendable'
          FROM ledger_bucket
         WHERE expired_at IS NOT NULL AND granted - consumed - held - expired > 0
        """,
        "nothing is drawn from a bucket at or after its expiry; expired stays expired",
    ),
    "budget_cache_mismatch": (
        """
        SELECT 'budget:' || b.id,
               format('cached held %%s consumed %%s, holds say %%s and %%s',
                      b.held, b.consumed, x.held, x.consumed)
          FROM ledger_budget b
          CROSS JOIN LATERAL (
              SELECT coalesce(sum(h.amount) FILTER (WHERE h.state = 'active'), 0) AS held,
                     coalesce(sum(h.captured) FILTER (
                         WHERE h.state <> 'active'
                           AND (b.period = 'total'
                                OR (h.settled_at >= b.period_start
                                    AND h.settled_at < b.period_start + interval '1 month'))
                     ), 0) AS consumed
                FROM ledger_hold h
               WHERE h.org_id = b.org_id
                 AND (b.project_id IS NULL OR h.project_id = b.project_id)
                 AND (b.user_id IS NULL OR h.user_id = b.user_id)
                 AND h.lane %% b.lanes = b.lane
          ) x
         WHERE (b.held, b.consumed) <> (x.held, x.consumed)
        """,
        "budget caches (each lane's) equal the holds beneath them",
    ),
    "budget_lanes_inconsistent": (
        """
        SELECT 'budget:' || coalesce(b.lane_of_id, b.id),
               format('%%s lanes of %%s, shares add up to %%s for a limit of %%s%%s',
                      count(*), max(b.lanes), sum(b.share), max(b."limit"),
                      CASE WHEN bool_or(b.mode = 'hard' AND NOT b.unbalanced
                                        AND b.held + c.consumed > b.share)
                           THEN ', a lane over its share while none is marked unbalanced'
                           ELSE '' END)
          FROM ledger_budget b
         CROSS JOIN LATERAL (
              SELECT CASE WHEN b.period = 'month'
                               AND b.period_start < date_trunc('month', now(), 'UTC')
                          THEN 0 ELSE b.consumed END AS consumed
         ) c
         GROUP BY coalesce(b.lane_of_id, b.id)
        HAVING count(*) <> max(b.lanes) OR min(b.lanes) <> max(b.lanes)
            OR min(b."limit") <> max(b."limit") OR sum(b.share) <> max(b."limit")
            OR bool_or(b.mode = 'hard' AND NOT b.unbalanced AND b.held + c.consumed > b.share)
        """,
        "a budget's lanes add up to its limit, and a hard one charges a lane past its share "
        "only while it is marked unbalanced",
    ),
}


def reconcile(*, record: bool = True) -> list[Violation]:
    """Check every invariant against the entries; return the violations found.

    With `record`, publish them as metrics and audit events (see module docstring).
    """
    violations: list[Violation] = []
    per_check: dict[str, int] = {}
    with connection.cursor() as cursor:
        for check, (sql, _guards) in CHECKS.items():
            cursor.execute(sql, [])  # with params, so the SQL's %% are escapes
            found = [Violation(check, subject, detail) for subject, detail in cursor.fetchall()]
            per_check[check] = len(found)
            violations.extend(found)
    if record:
        _publish(violations, per_check)
    return violations


def _publish(violations: list[Violation], per_check: dict[str, int]) -> None:
    for check, found in per_check.items():
        RECONCILE_VIOLATIONS.labels(check=check).set(found)
    RECONCILE_RUNS.inc()
    RECONCILE_LAST_RUN.set(time.time())
    current = {v.fingerprint: v for v in violations}
    with transaction.atomic():
        LedgerAuditEvent.objects.bulk_create(
            [
                LedgerAuditEvent(
                    check_name=v.check, subject=v.subject[:200], detail=v.detail, fingerprint=fp
                )
                for fp, v in current.items()
            ],
            ignore_conflicts=True,  # already open from an earlier run
        )
        LedgerAuditEvent.objects.filter(resolved_at__isnull=True).exclude(
            fingerprint__in=list(current)
        ).update(resolved_at=Now())
