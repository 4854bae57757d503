"""The batched hot path of metering: heartbeats go to Redis, a beat task folds them in.

record_usage() does one Redis command and touches no database row: ZADD GT on a
sorted set whose member is "hold|attempt" and whose score is the cumulative usage, so
Redis itself keeps the largest report of each attempt, atomically. fold_usage_reports()
renames the pending set to an in-flight one (an atomic snapshot; new reports go to a
fresh pending set), meters it into the ledger in batches of one transaction each, then
deletes it.

- A crash between reading and deleting leaves the in-flight set, which the next fold
  meters again: harmless, because metering keeps the maximum cumulative per (hold,
  attempt) and captures only what is new.
- Concurrent folds: a session advisory lock lets one work and the others return 0.
- Redis losing the set (restart, FLUSHDB) loses reports, not credit: the next report
  of each attempt is cumulative and carries everything.
- Reports are ordered by cumulative alone here (seq is validated, not stored): for one
  attempt both rise together, and the ledger keeps the maximum either way.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid

import redis
from django.conf import settings

from apps.core import locks
from apps.ledger.metrics import FOLD_SECONDS, USAGE_REPORTS
from apps.ledger.services._transaction import LedgerTransaction, ledger_setting
from apps.ledger.services.metering import UsageReport, apply_usage, lock_holds, validate_report

logger = logging.getLogger(__name__)

DEFAULT_BATCH_LIMIT = 2000

# Take a snapshot: pending becomes in-flight, unless a crashed fold left one behind,
# which is then folded first. Returns {reports in flight, 1 if it was a leftover}.
_SNAPSHOT = """
if redis.call('EXISTS', KEYS[2]) == 1 then
    return {redis.call('ZCARD', KEYS[2]), 1}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
    return {0, 0}
end
redis.call('RENAME', KEYS[1], KEYS[2])
return {redis.call('ZCARD', KEYS[2]), 0}
"""


@functools.cache
def _client() -> redis.Redis:
    # One pool per process; redis-py re-creates connections after a fork.
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=10)


@functools.cache
def _script(source: str):
    return _client().register_script(source)


def _keys() -> tuple[str, str]:
    prefix = ledger_setting("USAGE_KEY_PREFIX", "gantry:ledger:usage")
    return f"{prefix}:pending", f"{prefix}:inflight"


_RECORDED = USAGE_REPORTS.labels(stage="recorded")


class _Writer(threading.local):
    """Each thread's own Redis connection for record_usage, with the ZADD pre-encoded.

    The heartbeat path is one command; redis-py's pooled client spends several times
    the command's own cost on packing and pool bookkeeping, so this thread sends the
    encoded command on its own connection (made by redis-py: URL, auth, database and
    reconnects stay redis-py's), and re-creates it after a fork or a connection error.
    """

    pid = 0
    connection = None
    head = b""

    def send(self, member: bytes, score: bytes) -> int:
        if self.pid != os.getpid() or self.connection is None:
            self.connection = _client().connection_pool.make_connection()
            self.pid = os.getpid()
            key = _keys()[0].encode()
            self.head = b"*6\r\n$4\r\nZADD\r\n$%d\r\n%s\r\n$2\r\nGT\r\n$2\r\nCH\r\n" % (
                len(key),
                key,
            )
        command = b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            self.head,
            len(score),
            score,
            len(member),
            member,
        )
        try:
            self.connection.send_packed_command([command], check_health=False)
            return self.connection.read_response()
        except (redis.ConnectionError, redis.TimeoutError):
            self.connection.disconnect()
            self.connection = None
            raise


_writer = _Writer()


def record_usage(*, hold_id, attempt_key: str, cumulative_usage: int, seq: int) -> bool:
    """Accept a heartbeat's cumulative usage for folding into the ledger within seconds.

    One Redis command, no database. Returns False when Redis already holds a report at
    least as large for this (hold, attempt), which the fold will apply anyway.
    """
    validate_report(cumulative_usage=cumulative_usage, seq=seq, attempt_key=attempt_key)
    if cumulative_usage >= 2**53:  # exact in a Redis score (a double) up to here
        raise ValueError("cumulative_usage too large for the batched path; use meter()")
    hold = hold_id if isinstance(hold_id, uuid.UUID) else uuid.UUID(str(hold_id))
    kept = _writer.send(f"{hold}|{attempt_key}".encode(), b"%d" % cumulative_usage)
    _RECORDED.inc()
    return bool(kept)


def pending_usage_reports() -> int:
    """How many (hold, attempt) reports wait to be folded."""
    pending, inflight = _keys()
    client = _client()
    return client.zcard(pending) + client.zcard(inflight)


def fold_usage_reports(*, batch_limit: int = DEFAULT_BATCH_LIMIT) -> int:
    """Meter the pending usage reports into the ledger, `batch_limit` per transaction.

    Returns how many reports were folded (0 if another fold is running).
    """
    folded = 0
    started = time.monotonic()
    with locks.try_session_lock("gantry.ledger.fold_usage_reports") as acquired:
        if not acquired:
            return 0
        pending, inflight = _keys()
        client = _client()
        # At most a leftover snapshot and then the current one: a fold never chases an
        # endless stream; the next tick takes what arrived meanwhile.
        for _round in range(2):
            size, leftover = _script(_SNAPSHOT)(keys=[pending, inflight])
            if not size:
                break
            # The in-flight set does not change while it is read: index ranges are stable.
            for start in range(0, size, batch_limit):
                chunk = client.zrange(inflight, start, start + batch_limit - 1, withscores=True)
                folded += _fold_batch([r for r in map(_parse, chunk) if r is not None])
            client.delete(inflight)
            if not leftover:
                break
    if folded:
        FOLD_SECONDS.observe(time.monotonic() - started)
        USAGE_REPORTS.labels(stage="folded").inc(folded)
    return folded


def _fold_batch(reports: list[UsageReport]) -> int:
    if not reports:
        return 0
    with LedgerTransaction() as tx:
        holds, now, _ = lock_holds(tx, (r.hold_id for r in reports))
        apply_usage(tx, holds, reports, now=now)
    return len(reports)


def _parse(item: tuple[bytes, float]) -> UsageReport | None:
    member, score = item
    try:
        hold, attempt_key = member.decode().split("|", 1)
        return UsageReport(uuid.UUID(hold), attempt_key, int(score), None)
    except ValueError:
        logger.warning("dropping a malformed usage report", extra={"member": member[:100]})
        return None
