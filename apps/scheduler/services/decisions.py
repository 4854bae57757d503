"""What every applied decision shares: its outcome, why it was refused, the node lock.

The dispatch tick (dispatch.py) applies placements and reservations and preemption.py
applies preemptions; both use these, so neither imports the other's internals.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import IntegrityError, OperationalError, connection, transaction

from apps.fleet.models import Node
from apps.jobs.models import Job
from apps.jobs.services.lifecycle import IllegalTransition
from apps.scheduler.models import DecisionKind, DecisionOutcome, DispatchDecision, NodeClaim
from apps.scheduler.policy import Decision, Place, Preempt

logger = logging.getLogger(__name__)

ACTOR = "scheduler"


class Refused(Exception):
    """A decision's guard failed: the world changed since the snapshot."""


@dataclass(frozen=True)
class AppliedDecision:
    kind: str
    outcome: str
    job_id: object
    node: str
    attempt_id: object = None
    fencing_token: int | None = None
    skip_reason: str = ""


def claim_node(*, job_id, node_id: int, kind: str, record: DispatchDecision) -> NodeClaim:
    """Make `node_id` the job's claimed node (replacing any earlier claim, fresh TTL)."""
    NodeClaim.objects.filter(job_id=job_id).delete()
    return NodeClaim.objects.create(job_id=job_id, node_id=node_id, kind=kind, decision=record)


def node_for_share(name: str) -> tuple[int, str]:
    """Lock the node row FOR SHARE (a drain or removal waits for us, and we for it)."""
    return nodes_for_share([name])[name]


def nodes_for_share(names: Iterable[str]) -> dict[str, tuple[int, str]]:
    """name -> (id, state) of these nodes, their rows locked FOR SHARE in id order (a
    drain or removal waits for us, and we for it); Refused if one no longer exists."""
    wanted = sorted(set(names))
    table = Node._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT name, id, state FROM {table}"  # noqa: S608
            " WHERE name = ANY(%s) ORDER BY id FOR SHARE",
            [wanted],
        )
        found = {name: (node_id, state) for name, node_id, state in cursor.fetchall()}
    for name in wanted:
        if name not in found:
            raise Refused(f"node {name} no longer exists")
    return found


# What makes a decision's guarded transaction give up: the decision is recorded as
# skipped with skip_reason(exc), and the next tick decides afresh.
SKIPPED_ON = (Refused, IllegalTransition, Job.DoesNotExist, IntegrityError, OperationalError)


def skip_reason(exc: Exception) -> str:
    """Why a decision was skipped, from what its transaction raised (SKIPPED_ON)."""
    if isinstance(exc, Job.DoesNotExist):
        return "the job no longer exists"
    if isinstance(exc, OperationalError):  # a deadlock or lock timeout: retried next tick
        return f"database: {str(exc).splitlines()[0][:200]}"
    if isinstance(exc, IntegrityError):
        text = str(exc)
        if "gpu_one_live_assignment" in text:
            return "a GPU of the decision was already assigned to another attempt"
        if "attempt_one_live_per_job" in text:
            return "the job already has a live attempt"
        return f"refused by the database: {text.splitlines()[0][:200]}"
    return str(exc)


def record_skipped(decision: Decision, *, tick: uuid.UUID, why: str) -> AppliedDecision:
    """Record a refused decision (its own transaction) and say so."""
    if isinstance(decision, Preempt):
        kind, job_id = DecisionKind.PREEMPT, decision.for_job_id
    else:
        kind = DecisionKind.PLACE if isinstance(decision, Place) else DecisionKind.RESERVE
        job_id = decision.job_id
    try:
        with transaction.atomic():
            DispatchDecision.objects.create(
                tick=tick,
                kind=kind,
                outcome=DecisionOutcome.SKIPPED,
                job_id=job_id,
                node_name=decision.node,
                gpu_type=getattr(decision, "gpu_type", ""),
                victims=list(getattr(decision, "job_ids", ())),
                reason=decision.reason,
                skip_reason=why,
            )
    except IntegrityError:  # the job itself vanished: nothing to attach the record to
        logger.info("skipped %s for missing job %s: %s", kind, job_id, why)
    return AppliedDecision(
        kind=kind,
        outcome=DecisionOutcome.SKIPPED,
        job_id=job_id,
        node=decision.node,
        skip_reason=why,
    )
