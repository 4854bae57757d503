"""Applying a preemption: ask the victims to stop, and keep their GPUs for the waiting job.

Each victim job goes running → preempting, which its runner is told of as the
transaction commits (jobs.services.stop_requests; at its next heartbeat at the latest);
the runner sends SIGTERM, gives the generator the grace period to checkpoint, then
jobs.services.attempts.finish_attempt ends the attempt, releases its GPUs and moves
the job preempting → queued (a runner that is gone has its lease reaped
by services.recovery.requeue_attempt, which does the same). Only then are the GPUs free
in the next snapshot, where the waiting job's NodeClaim (the policy's
`claimed_node`) makes sure it is the one placed there.
"""

from __future__ import annotations

import uuid

from django.db import transaction

from apps.fleet.models import NodeState
from apps.jobs.models import Attempt, AttemptState, Job, JobStatus
from apps.jobs.services import stop_requests
from apps.jobs.services.deadlines import PAST_START_DEADLINE
from apps.jobs.services.lifecycle import transition
from apps.scheduler.models import DecisionKind, DecisionOutcome, DispatchDecision
from apps.scheduler.policy import Preempt
from apps.scheduler.services import metrics
from apps.scheduler.services.decisions import (
    ACTOR,
    SKIPPED_ON,
    AppliedDecision,
    Refused,
    claim_node,
    node_for_share,
    record_skipped,
    skip_reason,
)

# What a preempted job's tenant reads: never the other job, its org or the scores.
PREEMPTED_FOR_TENANT = (
    "preempted for a higher-priority job; it is requeued and resumes from its last checkpoint"
)


def apply_preemption(decision: Preempt, *, tick: uuid.UUID) -> AppliedDecision:
    """Move every victim running → preempting and claim the node for the waiting job.

    All or nothing, in one transaction that locks the victims' and the waiting job's
    rows in primary-key order. Refused (recorded as skipped, nobody is stopped) when the
    waiting job is no longer queued or is past its start deadline, the node is not
    active, or any victim is no longer running that very attempt on that node, or is
    not preemptible.
    """
    try:
        with transaction.atomic():
            _preempt(decision, tick=tick)
    except SKIPPED_ON as exc:
        return record_skipped(decision, tick=tick, why=skip_reason(exc))
    return AppliedDecision(
        kind=DecisionKind.PREEMPT,
        outcome=DecisionOutcome.APPLIED,
        job_id=decision.for_job_id,
        node=decision.node,
    )


def _preempt(decision: Preempt, *, tick: uuid.UUID) -> None:
    # Snapshot ids are strings; compare everything as strings.
    victims_by_attempt = {
        str(a): str(j) for a, j in zip(decision.allocation_ids, decision.job_ids, strict=True)
    }
    for_job = str(decision.for_job_id)
    locked = {
        str(job.pk): job
        for job in Job.objects.select_for_update()
        .filter(pk__in={for_job, *victims_by_attempt.values()})
        .order_by("pk")
        .only("id", "status", "tier", "preemptible")
        .annotate(past_start_deadline=PAST_START_DEADLINE)
    }
    waiting = locked.get(for_job)
    if waiting is None or waiting.status != JobStatus.QUEUED:
        raise Refused(f"job {for_job} is no longer queued")
    if waiting.past_start_deadline:  # it will be cancelled, not started: stop nobody for it
        raise Refused(f"job {for_job} is past its start deadline")
    node_id, node_state = node_for_share(decision.node)
    if node_state != NodeState.ACTIVE:
        raise Refused(f"node {decision.node} is {node_state}")
    attempts = {
        str(attempt.pk): attempt
        for attempt in Attempt.objects.filter(pk__in=list(victims_by_attempt)).only(
            "id", "job_id", "state", "node_id"
        )
    }
    for attempt_id, job_id in victims_by_attempt.items():
        attempt, victim = attempts.get(attempt_id), locked.get(job_id)
        if attempt is None or victim is None or str(attempt.job_id) != job_id:
            raise Refused(f"attempt {attempt_id} of job {job_id} no longer exists")
        if attempt.state != AttemptState.RUNNING or victim.status != JobStatus.RUNNING:
            raise Refused(f"job {job_id} is {victim.status}, no longer running")
        if attempt.node_id != node_id:
            raise Refused(f"attempt {attempt_id} is not on {decision.node}")
        if not victim.preemptible:
            raise Refused(f"job {job_id} is not preemptible")
    for attempt_id, job_id in victims_by_attempt.items():
        transition(
            job_id,
            to=JobStatus.PREEMPTING,
            only_from=[JobStatus.RUNNING],
            reason=(
                f"preempted on {decision.node} to make room for job {waiting.pk} "
                f"({waiting.tier}): {decision.reason}"
            ),
            actor=ACTOR,
            attempt=attempts[attempt_id],
            data={"for_job": str(waiting.pk), "node": decision.node},
            public_reason=PREEMPTED_FOR_TENANT,
        )
    for job_id in victims_by_attempt.values():
        stop_requests.announce_stop_requested(job_id)
        transaction.on_commit(metrics.PREEMPTED_JOBS.labels(locked[job_id].tier).inc)
    record = DispatchDecision.objects.create(
        tick=tick,
        kind=DecisionKind.PREEMPT,
        outcome=DecisionOutcome.APPLIED,
        job_id=waiting.pk,
        node_name=decision.node,
        victims=list(victims_by_attempt.values()),
        reason=decision.reason,
    )
    claim_node(job_id=waiting.pk, node_id=node_id, kind=DecisionKind.PREEMPT, record=record)
