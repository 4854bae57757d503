"""Recording what operators do: one append-only OperatorAction row per action.

An operator's change and its row are written in one transaction (`operator_action`), so
the audit trail never shows an action that did not happen (or misses one that did). The
admin and the operator API record the same actions under the same names, most of them
through the operations modules both call (apps.accounts.operations,
apps.ledger.operations, apps.fleet.operations). An action refused in the admin is
recorded too, with the reason; a refused API call (an error answer) records nothing.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction

from apps.accounts.models import OperatorAction, Org
from apps.core.errors import GantryError

# Every action an operator can take (admin or API), as recorded in OperatorAction.action.
ACTIONS = {
    "node.drain": "Drain a node (no new work; running jobs finish)",
    "node.undrain": "Make a node active again",
    "node.remove": "Remove a node from the fleet",
    "node.add": "Add a node",
    "node.update": "Change a node or its GPUs",
    "gpu_type.update": "Add or change a GPU type (price, memory)",
    "job.cancel": "Cancel a job",
    "job.requeue": "Requeue a dead-lettered job as a new job",
    "credits.grant": "Grant credits (a new bucket)",
    "hold.settle": "Settle a hold at its metered usage",
    "quarantine.clear": "Clear a quarantined params fingerprint",
    "org.create": "Create an org",
    "org.update": "Change an org's tier, weight or quotas",
    "project.create": "Create a project in an org",
    "user.create": "Create a tenant user in an org",
    "user.update": "Change a tenant user's fair-share weight",
    "apikey.create": "Issue an API key",
    "budget.set": "Create or change a budget",
    "apikey.revoke": "Revoke an API key",
}


def operator_of(request) -> str:
    """Who acts, the one spelling of an operator everywhere (operator actions, job events,
    ledger reasons, the audit trail): `operator:<username>` in the Django admin,
    `api:<key prefix>` for an operator API key."""
    api_key = getattr(request.user, "api_key", None)
    if api_key is not None:
        return f"api:{api_key.prefix}"
    return f"operator:{request.user.get_username()}"


def api_operator(request) -> dict:
    """The `actor` and `record_refused` options of the operations for an operator API
    call: the key as actor; a refused call records nothing (its caller gets the error)."""
    return {"actor": operator_of(request), "record_refused": False}


def _jsonable(value: dict | None) -> dict:
    # Round-trip through Django's encoder: datetimes, UUIDs and Decimals become strings.
    return json.loads(json.dumps(value or {}, cls=DjangoJSONEncoder))


def record_operator_action(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id,
    org: Org | None = None,
    org_id=None,
    job_id=None,
    before: dict | None = None,
    after: dict | None = None,
    note: str = "",
    outcome: str = OperatorAction.Outcome.DONE,
    idempotency_key: str | None = None,
) -> OperatorAction:
    """Append one OperatorAction row and return it.

    With an `idempotency_key`, recording the same key again (a double-submitted form)
    returns the first row and writes nothing, even under concurrent calls.
    """
    if not actor:
        raise GantryError("An operator action needs an actor.", field="actor")
    row = OperatorAction(
        actor=actor[:200],
        action=action,
        target_type=target_type,
        target_id=str(target_id)[:200],
        org_id=org.pk if org is not None else org_id,
        job_id=job_id,
        before=_jsonable(before),
        after=_jsonable(after),
        note=note,
        outcome=outcome,
        idempotency_key=idempotency_key,
    )
    if idempotency_key is None:
        row.save()
        return row
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError:
        return OperatorAction.objects.get(idempotency_key=idempotency_key)
    return row


@dataclass
class PendingAction:
    """What `operator_action` records on exit; the block fills in `after` and the rest."""

    actor: str
    action: str
    target_type: str
    target_id: str
    org_id: object = None
    job_id: object = None
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    note: str = ""
    idempotency_key: str | None = None
    skip: bool = False  # set when the block found nothing to do (nothing to record)


@contextmanager
def operator_action(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id,
    record_refused: bool = True,
    **known,
):
    """Run an operator's change and record it, atomically.

    ``with operator_action(actor=..., action="node.drain", ...) as pending:`` runs the
    block in a transaction and records the action in it on success. If the block raises
    a GantryError the change is rolled back and the error propagates for the caller to
    show; with `record_refused` (the admin's way) a `refused` row is recorded first, with
    the error's message. The API passes False: its caller gets the error answer, and a
    refused call leaves no row (an idempotent view's transaction would drop it anyway).
    """
    pending = PendingAction(
        actor=actor, action=action, target_type=target_type, target_id=str(target_id), **known
    )
    try:
        with transaction.atomic():
            yield pending
            if not pending.skip:
                _record(pending, outcome=OperatorAction.Outcome.DONE)
    except GantryError as exc:
        if not record_refused:
            raise
        pending.note = exc.message
        pending.idempotency_key = None  # a retry after a refusal may well succeed
        _record(pending, outcome=OperatorAction.Outcome.REFUSED)
        raise


def _record(pending: PendingAction, *, outcome: str) -> OperatorAction:
    return record_operator_action(
        actor=pending.actor,
        action=pending.action,
        target_type=pending.target_type,
        target_id=pending.target_id,
        org_id=pending.org_id,
        job_id=pending.job_id,
        before=pending.before,
        after=pending.after,
        note=pending.note,
        outcome=outcome,
        idempotency_key=pending.idempotency_key,
    )
