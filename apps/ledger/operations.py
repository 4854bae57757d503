"""Operators' grants and budgets, each recorded as an OperatorAction in its transaction.

The admin and the operator API both call these (see apps.accounts.operations for the
`actor` and `record_refused` conventions); the money moves in apps.ledger.services.
"""

from __future__ import annotations

from datetime import datetime
from hashlib import sha256

from apps.accounts.operator_actions import operator_action
from apps.ledger import services
from apps.ledger.models import Bucket, Budget


def grant(
    *,
    actor: str,
    org,
    amount: int,
    kind: str,
    project=None,
    expires_at: datetime | None = None,
    idempotency_key: str,
    record_refused: bool = True,
) -> Bucket:
    """Grant credits (services.grant), recorded as credits.grant.

    The grant's idempotency key is also the row's: the same grant made again (a double
    submitted form, a retried request) is one bucket and one audit row.
    """
    with operator_action(
        actor=actor,
        action="credits.grant",
        target_type="bucket",
        target_id="",
        org_id=org.pk,
        # Hashed to a fixed size; scoped by org like the bucket's key.
        idempotency_key=f"credits.grant:{org.pk}:{sha256(idempotency_key.encode()).hexdigest()}",
        record_refused=record_refused,
    ) as pending:
        bucket = services.grant(
            org=org,
            project=project,
            kind=kind,
            amount=amount,
            expires_at=expires_at,
            idempotency_key=idempotency_key,
            actor=actor,
        )
        pending.target_id = bucket.pk
        pending.after = {
            "kind": bucket.kind,
            "amount": bucket.granted,
            "project": str(bucket.project_id or ""),
            "expires_at": bucket.expires_at,
        }
    return bucket


def set_budget(
    *,
    actor: str,
    org,
    limit: int,
    period: str,
    mode: str,
    project=None,
    user=None,
    record_refused: bool = True,
) -> Budget:
    """Create or change the budget of one scope (services.set_budget), recorded as
    budget.set with the scope's settings before (empty for a new budget) and after."""
    current = Budget.objects.filter(org=org, project=project, user=user, lane=0).first()
    with operator_action(
        actor=actor,
        action="budget.set",
        target_type="budget",
        target_id=current.pk if current else "",
        org_id=org.pk,
        before=budget_settings(current) if current else {},
        record_refused=record_refused,
    ) as pending:
        budget = services.set_budget(
            org=org, project=project, user=user, limit=limit, period=period, mode=mode
        )
        pending.target_id = budget.pk
        pending.after = budget_settings(budget)
    return budget


def budget_settings(budget: Budget) -> dict:
    return {
        "project": str(budget.project_id or ""),
        "user": str(budget.user_id or ""),
        "limit": budget.limit,
        "period": budget.period,
        "mode": budget.mode,
    }
