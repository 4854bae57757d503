"""Where each queued job stands: its position, why it waits, when it should start.

The dispatch tick writes one entry per queued job it looked at (`publish`, every
GANTRY_QUEUE_STATE_INTERVAL_S), and the job body reads it (`read`). Entries live in
Redis and expire a few publications after they were written: hot, rebuildable state.
A tick looks at each submitter's oldest queued jobs only (the policy's queue window), so
it also writes, for each submitter some of whose jobs it left out, how many it looked at
and when the newest of those joined the queue: a job further back reads that it waits
behind them (`read_for`). With Redis down, or for a job no tick has looked at yet, the
body shows nulls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from django.conf import settings

from apps.core.redis import redis_client
from apps.jobs.models import Job

logger = logging.getLogger(__name__)

KEY = "gantry:queue:{}"
SUBMITTER_KEY = "gantry:queue:submitter:{}:{}"  # org id, user id ('' for the org's own keys)


@dataclass(frozen=True)
class QueueState:
    position: int | None
    reason: str  # for the tenant: names no other tenant, job or internal score
    estimated_start_at: datetime | None
    detail: str = ""  # the whole reason, for operators

    def body(self) -> dict:
        """The job body's `queue` (docs/api.md)."""
        start = self.estimated_start_at
        return {
            "position": self.position,
            "reason": self.reason,
            "estimated_start_at": start.isoformat().replace("+00:00", "Z") if start else None,
        }


UNKNOWN = QueueState(
    position=None, reason="waiting to be looked at by the scheduler", estimated_start_at=None
)


@dataclass(frozen=True)
class SubmitterWindow:
    """Of one submitter's queued jobs, those a tick looked at: how many, and when the
    newest of them joined the queue (epoch seconds, the queue's own order)."""

    looked_at: int
    newest_at: float


def behind_window(window: SubmitterWindow) -> QueueState:
    """A job further back than the jobs of its submitter that the tick looked at."""
    return QueueState(
        position=None,
        reason=(
            f"further back than the {window.looked_at:,} oldest queued jobs from the same "
            "submitter, which the scheduler looks at first; it comes into view as they start"
        ),
        estimated_start_at=None,
    )


def ttl_s() -> int:
    """Entries outlive a few missed publications, not a stopped dispatcher."""
    interval = max(settings.GANTRY_DISPATCH_INTERVAL_S, settings.GANTRY_QUEUE_STATE_INTERVAL_S)
    return max(10, int(3 * interval))


def publish(
    states: Iterable[tuple[str, QueueState]],
    *,
    windows: Mapping[tuple[str, str], SubmitterWindow] | None = None,
) -> int:
    """Write these jobs' states, and the `windows` of the submitters ((org id, user id or
    '') whose jobs the tick did not all look at), in one pipeline; returns how many job
    states. Fails soft: a Redis outage costs the tenants their queue details, never a
    dispatch tick."""
    expiry = ttl_s()
    written = 0
    try:
        with redis_client().pipeline(transaction=False) as pipe:
            for (org, user), window in (windows or {}).items():
                value = {"n": window.looked_at, "t": window.newest_at}
                pipe.set(SUBMITTER_KEY.format(org, user), json.dumps(value), ex=expiry)
            for job_id, state in states:
                start = state.estimated_start_at
                value = {
                    "p": state.position,
                    "r": state.reason,
                    "s": start.timestamp() if start else None,
                    "d": state.detail,
                }
                pipe.set(KEY.format(job_id), json.dumps(value, separators=(",", ":")), ex=expiry)
                written += 1
            pipe.execute()
    except redis.RedisError as exc:
        logger.warning("queue states not published: %s", exc)
        return 0
    return written


def read(job_ids: Iterable) -> dict[str, QueueState]:
    """job id -> its state, for those that have one (nothing when Redis is down)."""
    ids = [str(job_id) for job_id in job_ids]
    values = _values([KEY.format(job_id) for job_id in ids])
    return {job_id: decode(raw) for job_id, raw in zip(ids, values, strict=True) if raw is not None}


def read_for(jobs: Iterable[Job]) -> dict[str, QueueState]:
    """`read` for these queued jobs, and for each that has no state of its own but sits
    behind the jobs its submitter's window held at the last tick, `behind_window`: the
    states and the windows in one round trip."""
    jobs = list(jobs)
    submitter_of = {str(job.id): (str(job.org_id), str(job.user_id or "")) for job in jobs}
    submitters = list(dict.fromkeys(submitter_of.values()))
    values = _values(
        [KEY.format(job.id) for job in jobs]
        + [SUBMITTER_KEY.format(*submitter) for submitter in submitters]
    )
    own, windows = values[: len(jobs)], dict(zip(submitters, values[len(jobs) :], strict=True))
    states = {}
    for job, raw in zip(jobs, own, strict=True):
        window = windows[submitter_of[str(job.id)]]
        if raw is not None:
            states[str(job.id)] = decode(raw)
        elif window is not None:
            value = json.loads(window)
            if place_in_queue(job) > value["t"]:
                states[str(job.id)] = behind_window(
                    SubmitterWindow(looked_at=value["n"], newest_at=value["t"])
                )
    return states


def _values(keys: list[str]) -> list:
    """The keys' values (None where missing), or all None when Redis cannot be read."""
    if not keys:
        return []
    try:
        return redis_client().mget(keys)
    except redis.RedisError as exc:
        logger.warning("queue states not read: %s", exc)
        return [None] * len(keys)


def place_in_queue(job: Job) -> float:
    """When the job joined the queue, as the dispatcher orders it (epoch seconds): a job
    sent back by preemption keeps the place it had since it was submitted (the rule of
    scheduler.services.snapshot's QUEUED_SQL, which the tick's windows are made from)."""
    joined = job.created_at if job.preemption_count > 0 else job.queued_at
    return joined.timestamp()


def key_of(job_id) -> str:
    return KEY.format(job_id)


def decode(raw: bytes) -> QueueState:
    """A stored entry (as `publish` writes it) as a QueueState."""
    value = json.loads(raw)
    start = value.get("s")
    return QueueState(
        position=value.get("p"),
        reason=value.get("r", ""),
        estimated_start_at=datetime.fromtimestamp(start, UTC) if start is not None else None,
        detail=value.get("d", ""),
    )
