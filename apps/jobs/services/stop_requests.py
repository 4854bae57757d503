"""Telling a running attempt's worker at once that its job should stop.

A cancel or a preemption is written to PostgreSQL (the job's `cancel_requested`, or
running → preempting; or the job is ended under its runner, its credit hold expired),
which the attempt's runner reads on its next heartbeat
(GANTRY_HEARTBEAT_S). So that the generator is stopped within a fraction of a second
instead, the change also publishes a nudge on the job's stop channel once it commits
(`announce_stop_requested`); the runner listens there while it supervises the attempt
(`watch`) and, nudged, heartbeats at once. The nudge carries nothing but "look now":
the heartbeat's read of the database decides, as before, so a lost nudge (Redis down, a
listener that subscribed late) only means the stop waits for the next heartbeat.

A worker process holds one Redis connection for all the attempts it runs: one listener
thread subscribes each watched job's channel and drops it when the attempt ends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import redis
from django.conf import settings

from apps.core.redis import publish_on_commit

logger = logging.getLogger(__name__)

# How long the listener blocks on Redis before it looks at what to (un)subscribe; also
# the longest a newly watched job waits for its subscription.
_POLL_S = 0.1
# How long `watch` waits for its subscription before it goes on without it.
SUBSCRIBE_TIMEOUT_S = 1.0
_RECONNECT_PAUSE_S = 1.0


def channel_of(job_id) -> str:
    return f"gantry:job-stop:{job_id}"


def announce_stop_requested(job_id) -> None:
    """Nudge the runner of the job's attempt once the current transaction commits (at
    once outside one). Best effort: without Redis the runner stops at its next heartbeat."""
    publish_on_commit(channel_of(job_id), b"stop")


class _Listener:
    """This process's subscriptions to the stop channels of the jobs it runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[str, set[threading.Event]] = {}
        self._subscribed: dict[str, threading.Event] = {}  # set once the channel is live
        self._confirmed: set[str] = set()  # channels Redis confirmed and has not dropped
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watch(self, job_id) -> Iterator[threading.Event]:
        """An event set whenever the job's stop is announced, for as long as the block
        runs. Waits (up to SUBSCRIBE_TIMEOUT_S) until the subscription is live, so that a
        stop announced after this returns is heard."""
        channel, nudged = channel_of(job_id), threading.Event()
        with self._lock:
            self._watchers.setdefault(channel, set()).add(nudged)
            live = self._subscribed.setdefault(channel, threading.Event())
            if channel in self._confirmed:  # still subscribed for an earlier watcher
                live.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="stop-request-listener", daemon=True
                )
                self._thread.start()
        if not live.wait(SUBSCRIBE_TIMEOUT_S):
            logger.info("stop nudges not subscribed for job %s: heartbeats only", job_id)
        try:
            yield nudged
        finally:
            with self._lock:
                watchers = self._watchers.get(channel, set())
                watchers.discard(nudged)
                if not watchers:
                    self._watchers.pop(channel, None)
                    self._subscribed.pop(channel, None)

    def _run(self) -> None:
        pubsub, sent = None, set()
        while True:
            try:
                if pubsub is None:
                    client = redis.Redis.from_url(
                        settings.REDIS_URL,
                        socket_connect_timeout=1.0,
                        socket_timeout=5.0,
                        health_check_interval=30,  # a silent link is found out, not trusted
                    )
                    pubsub, sent = client.pubsub(), set()
                sent = self._follow(pubsub, sent)
                if not sent:
                    time.sleep(_POLL_S)
                    continue
                message = pubsub.get_message(timeout=_POLL_S)
                if message is not None:
                    self._deliver(message)
            except Exception as exc:  # Redis lost (or worse): the heartbeats go on regardless
                logger.warning("stop-request listener lost Redis: %s", type(exc).__name__)
                with contextlib.suppress(Exception):
                    pubsub.close()
                pubsub = None
                with self._lock:
                    self._confirmed.clear()
                    for live in self._subscribed.values():
                        live.clear()
                time.sleep(_RECONNECT_PAUSE_S)

    def _follow(self, pubsub, sent: set[str]) -> set[str]:
        """Subscribe the channels now watched and drop the others; returns the channels
        asked for (each is live once Redis confirms it, see _deliver)."""
        with self._lock:
            wanted = set(self._watchers)
        if wanted - sent:
            pubsub.subscribe(*(wanted - sent))
        if sent - wanted:
            with self._lock:  # no longer live for a watcher that comes meanwhile
                self._confirmed.difference_update(sent - wanted)
            pubsub.unsubscribe(*(sent - wanted))
        return wanted

    def _deliver(self, message: dict) -> None:
        channel = message["channel"]
        channel = channel.decode() if isinstance(channel, bytes) else channel
        with self._lock:
            if message["type"] == "subscribe":  # from now on a stop announced is heard
                self._confirmed.add(channel)
                live = self._subscribed.get(channel)
                if live is not None:
                    live.set()
            elif message["type"] == "unsubscribe":
                self._confirmed.discard(channel)
            elif message["type"] == "message":
                for nudged in self._watchers.get(channel, ()):
                    nudged.set()


_listener = _Listener()


def watch(job_id):
    """`_Listener.watch` of this process's listener (see the module docstring)."""
    return _listener.watch(job_id)
