"""What the generator printed, per attempt: captured bounded, followed live, kept.

The runner feeds every line of the generator's stdout and stderr, in the order they
arrive, to an `AttemptLog`. It keeps the first and the last `GANTRY_LOG_LIMIT_BYTES / 2`
of a run that prints more, and says what it cut, so neither a traceback at the end nor
the command line at the start is lost and a runaway generator costs bounded memory.

While the attempt runs, the runner publishes its new lines every poll: appended, with
sequence numbers, to a capped Redis list (the latest `LIVE_BUFFER_LINES`, for a
follower that comes late or misses a nudge) and announced on the attempt's channel, a
nudge that wakes followers (apps.core.pubsub). When the attempt ends, the whole bounded
log is stored through the result storage backend beside the job's output (so it lives
as long as the result does), and the end is announced.
"""

from __future__ import annotations

import collections
import logging
import tempfile
import threading
from pathlib import Path

import redis
from django.conf import settings

from apps.core.redis import redis_client
from apps.jobs.models import Attempt, AttemptState, Job
from apps.jobs.services.results import storage

logger = logging.getLogger(__name__)

MAX_LINE_CHARS = 16_384
LIVE_BUFFER_LINES = 2000
LIVE_BUFFER_TTL_S = 24 * 3600
END = "\x00end"  # the buffer's last entry once the attempt has ended (NUL: never a line)


def live_channel(attempt_id) -> str:
    return f"gantry:attempt-log:{attempt_id}"


def _live_buffer(attempt_id) -> str:
    return f"gantry:attempt-log-lines:{attempt_id}"


def log_key(job: Job, attempt_number: int) -> str:
    """Where an attempt's log is stored: apart from outputs (no output name can clash)."""
    return f"logs/{job.org_id}/{job.pk}/attempt-{attempt_number}.log"


class AttemptLog:
    """The bounded, ordered log of one attempt; `add` is thread-safe (two readers)."""

    def __init__(self, *, limit_bytes: int | None = None):
        limit = settings.GANTRY_LOG_LIMIT_BYTES if limit_bytes is None else limit_bytes
        self._half = max(1, limit // 2)
        self._head: list[str] = []
        self._head_bytes = 0
        self._tail: collections.deque[str] = collections.deque()
        self._tail_bytes = 0
        self._cut_lines = 0
        self._cut_bytes = 0
        self._lock = threading.Lock()
        self._pending: list[tuple[int, str]] = []
        self.lines_seen = 0

    def add(self, line: str) -> None:
        if len(line) > MAX_LINE_CHARS:  # one endless line must not defeat the bound
            line = f"{line[:MAX_LINE_CHARS]} [... {len(line) - MAX_LINE_CHARS} characters cut]"
        size = len(line.encode("utf-8", "replace")) + 1
        with self._lock:
            self.lines_seen += 1
            self._pending.append((self.lines_seen, line))
            if self._head_bytes + size <= self._half and not self._tail:
                self._head.append(line)
                self._head_bytes += size
                return
            self._tail.append(line)
            self._tail_bytes += size
            while self._tail_bytes > self._half and len(self._tail) > 1:
                dropped = self._tail.popleft()
                self._tail_bytes -= len(dropped.encode("utf-8", "replace")) + 1
                self._cut_lines += 1
                self._cut_bytes += len(dropped.encode("utf-8", "replace")) + 1

    def take_pending(self) -> list[tuple[int, str]]:
        """The lines added since the last call, with their sequence numbers (from 1)."""
        with self._lock:
            pending, self._pending = self._pending, []
        return pending

    def text(self) -> str:
        with self._lock:
            parts = list(self._head)
            if self._cut_lines:
                parts.append(
                    f"[... {self._cut_lines} lines ({self._cut_bytes} bytes) cut: the log "
                    f"keeps the first and the last {self._half} bytes ...]"
                )
            parts.extend(self._tail)
        return "".join(f"{line}\n" for line in parts)


def publish_lines(attempt_id, lines: list[tuple[int, str]]) -> None:
    """Append `lines` to the attempt's live buffer and nudge its followers. Best effort:
    without Redis, followers see the stored log at the end."""
    if not lines:
        return
    key = _live_buffer(attempt_id)
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.rpush(key, *(f"{seq}\t{line}" for seq, line in lines))
        pipe.ltrim(key, -LIVE_BUFFER_LINES, -1)
        pipe.expire(key, LIVE_BUFFER_TTL_S)
        pipe.publish(live_channel(attempt_id), b"1")
        pipe.execute()
    except redis.RedisError:  # the run must not fail over its log
        logger.debug("attempt %s: live log lines not published", attempt_id, exc_info=True)


def publish_end(attempt_id) -> None:
    key = _live_buffer(attempt_id)
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.rpush(key, f"0\t{END}")
        pipe.expire(key, LIVE_BUFFER_TTL_S)
        pipe.publish(live_channel(attempt_id), b"1")
        pipe.execute()
    except redis.RedisError:
        logger.debug("attempt %s: log end not published", attempt_id, exc_info=True)


def live_lines(attempt_id, *, after: int = 0) -> tuple[list[tuple[int, str]], bool]:
    """(lines with a sequence number above `after`, whether the attempt's log ended),
    from the live buffer; ([], False) without Redis or once the buffer has expired."""
    try:
        raw = redis_client().lrange(_live_buffer(attempt_id), 0, -1)
    except redis.RedisError:
        return [], False
    lines, ended = [], False
    for entry in raw:
        seq, _, line = entry.decode("utf-8", "replace").partition("\t")
        if line == END:
            ended = True
        elif int(seq) > after:
            lines.append((int(seq), line))
    return lines, ended


def store_attempt_log(job: Job, attempt_number: int, log: AttemptLog) -> str:
    """Store the attempt's bounded log; returns its key. Storing again overwrites it."""
    key = log_key(job, attempt_number)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".log", delete=False) as fh:
        fh.write(log.text())
        path = Path(fh.name)
    try:
        storage().save(key, path)
    finally:
        path.unlink(missing_ok=True)
    return key


def stored_attempt_log(job: Job, attempt_number: int) -> str | None:
    """The stored log of an ended attempt, or None when there is none (yet)."""
    key = log_key(job, attempt_number)
    store = storage()
    if not store.exists(key):
        return None
    with store.open(key) as handle:
        return handle.read().decode("utf-8", "replace")


def attempt_has_ended(attempt_id) -> bool:
    return Attempt.objects.filter(pk=attempt_id, state=AttemptState.FINISHED).exists()


def current_log_text(job: Job, attempt: Attempt) -> str | None:
    """An attempt's log as it stands: the stored one once it ended, else what the live
    buffer holds (its latest lines); None when neither is there any more."""
    stored = stored_attempt_log(job, attempt.number)
    if stored is not None:
        return stored
    lines, _ = live_lines(attempt.pk)
    if not lines and attempt_has_ended(attempt.pk):
        return None
    skipped = lines[0][0] - 1 if lines else 0
    head = f"[... {skipped} earlier lines, stored when the attempt ends ...]\n" if skipped else ""
    return head + "".join(f"{line}\n" for _, line in lines)
