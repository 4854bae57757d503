"""Live job status for `GET /v1/jobs/{id}/stream` (Server-Sent Events).

Whatever changes a job (a transition, a progress report) publishes a nudge on the job's
channel once its transaction commits (`announce_job_changed`). Each open stream is a
coroutine on the API's event loop (config/asgi.py serves stream paths with Django's
async handler), waiting on the process's shared subscription (apps.core.pubsub), so a
listener costs a queue and a task, not a thread or a connection. Nudged, it re-reads the
job from PostgreSQL (in a worker thread) and sends `event: job` with the body if
anything a tenant sees changed: status, progress (at most twice a second), queue
position, reason or estimate, attempts, cost. While queued, its queue entry (which the
dispatcher publishes to Redis every few seconds) is read for all the loop's streams at
once by a QueueWatch, without PostgreSQL; and every
`FULL_REREAD_S` it re-reads the job regardless, since pub/sub loses what nobody heard
(a restart of Redis, a listener that subscribed a moment late). After a terminal status
the stream sends the final body and closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable

import redis

from apps.core.pubsub import channel_hub
from apps.core.redis import publish_on_commit
from apps.jobs import queue_state
from apps.jobs.services import logs

logger = logging.getLogger(__name__)

PROGRESS_MIN_INTERVAL_S = 0.5  # API.md: progress at most twice a second
QUEUE_POLL_S = 2.0  # queued jobs' positions and estimates, from Redis (one MGET a loop)
FULL_REREAD_S = 30.0  # the job itself, in case a nudge was lost
KEEPALIVE_S = 15.0  # a comment line keeps proxies from closing an idle stream
TERMINAL = frozenset(("succeeded", "failed", "timed_out", "cancelled"))


def channel_of(job_id) -> str:
    return f"gantry:job-changed:{job_id}"


def announce_job_changed(job_id) -> None:
    """Nudge the job's listeners once the current transaction commits (right away
    outside one). Best effort: Redis down only delays listeners until their re-read."""
    publish_on_commit(channel_of(job_id))


def _seen_by_tenant(body: dict) -> tuple:
    """The parts of a body whose change is news (the result link is re-signed on every
    read, so it does not count)."""
    hold = body.get("hold") or {}
    return (
        body.get("status"),
        body.get("attempts"),
        body.get("preemptions"),
        body.get("gpu_type"),
        body.get("node"),
        json.dumps(body.get("queue"), sort_keys=True),
        json.dumps(body.get("error"), sort_keys=True),
        hold.get("state"),
        hold.get("charged"),
        body.get("cancel_requested"),
    )


def sse_event(body: dict, *, event_id: int) -> str:
    data = json.dumps(body, separators=(",", ":"))
    return f"event: job\nid: {event_id}\ndata: {data}\n\n"


class QueueWatch:
    """One loop's watch over the queue entries of the queued jobs it streams: every
    `QUEUE_POLL_S` one MGET for all of them (not a read per stream), and a nudge (b"q")
    to the listeners of each entry that changed; `latest[job_id]` holds the entry."""

    def __init__(self):
        self.listeners: dict[str, set[asyncio.Queue]] = {}
        self.latest: dict[str, dict | None] = {}
        self._raw: dict[str, bytes | None] = {}
        self._task: asyncio.Task | None = None

    @contextlib.contextmanager
    def watching(self, job_id: str, nudges: asyncio.Queue):
        self.listeners.setdefault(job_id, set()).add(nudges)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())
        try:
            yield
        finally:
            listeners = self.listeners.get(job_id, set())
            listeners.discard(nudges)
            if not listeners:
                self.listeners.pop(job_id, None)
                self.latest.pop(job_id, None)
                self._raw.pop(job_id, None)

    async def _poll(self) -> None:
        while self.listeners:
            await asyncio.sleep(QUEUE_POLL_S)
            ids = list(self.listeners)
            try:
                values = await channel_hub().client.mget([queue_state.key_of(j) for j in ids])
            except redis.RedisError:
                continue  # the listeners' own re-reads carry on
            for job_id, raw in zip(ids, values, strict=True):
                if raw is None or raw == self._raw.get(job_id):
                    continue
                self._raw[job_id] = raw
                self.latest[job_id] = queue_state.decode(raw).body()
                for nudges in self.listeners.get(job_id, ()):
                    if not nudges.full():
                        nudges.put_nowait(QUEUE_NUDGE)


QUEUE_NUDGE = b"q"
_watches: dict[int, QueueWatch] = {}


def queue_watch() -> QueueWatch:
    loop = asyncio.get_running_loop()
    watch = _watches.get(id(loop))
    if watch is None:
        watch = _watches[id(loop)] = QueueWatch()
    return watch


async def job_events(
    job_id,
    *,
    read_body: Callable[[], dict],
    run_sync: Callable,
) -> AsyncIterator[str]:
    """The stream of one job: its body at once, then on every change a tenant sees,
    closing after a terminal status.

    `read_body()` reads the job body from PostgreSQL (blocking, run through `run_sync`);
    while the job is queued, its queue entry comes from the loop's QueueWatch."""
    job_key = str(job_id)
    body = await run_sync(read_body)
    event_id = 1
    yield sse_event(body, event_id=event_id)
    if body["status"] in TERMINAL:
        return
    seen, progress = _seen_by_tenant(body), body.get("progress")  # seen[0]: the status
    last_sent = last_full = time.monotonic()
    watch = queue_watch()
    async with channel_hub().listen(channel_of(job_id)) as nudges:
        with watch.watching(job_key, nudges):
            while True:
                nudge = None
                with contextlib.suppress(TimeoutError):
                    nudge = await asyncio.wait_for(nudges.get(), timeout=KEEPALIVE_S)
                now = time.monotonic()
                if nudge == QUEUE_NUDGE and body["status"] == "queued":
                    body = {**body, "queue": watch.latest.get(job_key) or body["queue"]}
                elif nudge is not None or now - last_full >= FULL_REREAD_S:
                    body, last_full = await run_sync(read_body), now
                news = _seen_by_tenant(body) != seen or body.get("progress") != progress
                within = body["status"] == seen[0]
                if news and within and now - last_sent < PROGRESS_MIN_INTERVAL_S:
                    # Within a status, updates (progress, cost) come at most twice a
                    # second: hold this one back and send the latest then.
                    await asyncio.sleep(PROGRESS_MIN_INTERVAL_S - (now - last_sent))
                    body, now = await run_sync(read_body), time.monotonic()
                if news:
                    event_id += 1
                    yield sse_event(body, event_id=event_id)
                    seen, progress, last_sent = _seen_by_tenant(body), body.get("progress"), now
                elif now - last_sent >= KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    last_sent = now
                if body["status"] in TERMINAL:
                    return


LOG_POLL_S = 2.0  # a follower re-reads the buffer this often without a nudge


def sse_line(line: str) -> str:
    return f"event: line\ndata: {line.replace(chr(13), '')}\n\n"  # a CR would end the field


async def log_events(job, attempt, *, run_sync) -> AsyncIterator[str]:
    """An attempt's log as `event: line` events: what it printed so far, then each new
    line as it comes, until the attempt ends (its stored log for an attempt that has)."""
    ended_attempt = await run_sync(logs.attempt_has_ended)(attempt.pk)
    if ended_attempt:
        text = await run_sync(logs.stored_attempt_log)(job, attempt.number)
        for line in (text or "").splitlines():
            yield sse_line(line)
        return
    last_seq, idle_since = 0, time.monotonic()
    async with channel_hub().listen(logs.live_channel(attempt.pk)) as nudges:
        while True:
            lines, ended = await run_sync(logs.live_lines)(attempt.pk, after=last_seq)
            if lines and lines[0][0] > last_seq + 1:
                yield sse_line(f"[... {lines[0][0] - last_seq - 1} lines skipped ...]")
            for seq, line in lines:
                yield sse_line(line)
                last_seq = seq
            if ended:
                return
            try:
                await asyncio.wait_for(nudges.get(), timeout=LOG_POLL_S)
            except TimeoutError:
                if time.monotonic() - idle_since >= KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    idle_since = time.monotonic()
                if await run_sync(logs.attempt_has_ended)(attempt.pk):
                    # Ended without the end reaching the buffer (Redis was away).
                    lines, _ = await run_sync(logs.live_lines)(attempt.pk, after=last_seq)
                    for _, line in lines:
                        yield sse_line(line)
                    return
