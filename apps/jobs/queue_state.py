"""Where each queued job stands: its position, why it waits, when it should start.

The dispatch tick writes one entry per queued job it looked at (`publish`, every
GANTRY_QUEUE_STATE_INTERVAL_S), and the job body reads it (`read`). Entries live in
Redis and expire a few publications after they were written: hot, rebuildable state.
With Redis down, or for a job no tick has looked at yet (deep in a long queue), the
body shows nulls.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from django.conf import settings

from apps.core.redis import redis_client

logger = logging.getLogger(__name__)

KEY = "gantry:queue:{}"


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


def ttl_s() -> int:
    """Entries outlive a few missed publications, not a stopped dispatcher."""
    interval = max(settings.GANTRY_DISPATCH_INTERVAL_S, settings.GANTRY_QUEUE_STATE_INTERVAL_S)
    return max(10, int(3 * interval))


def publish(states: Iterable[tuple[str, QueueState]]) -> int:
    """Write these jobs' states (one pipeline); returns how many. Fails soft: a Redis
    outage costs the tenants their queue details, never a dispatch tick."""
    expiry = ttl_s()
    written = 0
    try:
        with redis_client().pipeline(transaction=False) as pipe:
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
    if not ids:
        return {}
    try:
        values = redis_client().mget([KEY.format(job_id) for job_id in ids])
    except redis.RedisError as exc:
        logger.warning("queue states not read: %s", exc)
        return {}
    return {job_id: decode(raw) for job_id, raw in zip(ids, values, strict=True) if raw is not None}


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
