"""Redis pub/sub fanned out to many listeners over one connection per process.

Two kinds of process listen, each its own way: the API's event loop (an open stream, a
tenant following a job, waits on an asyncio queue: `ChannelHub`, `channel_hub`) and a
worker's threads (a running attempt waits on a threading.Event: `ThreadChannelHub`).
Either way a process holds one Redis connection for all its listeners, subscribes a
channel while someone listens to it and drops it when the last one leaves. Messages are
nudges ("look again"), not state: pub/sub forgets what nobody hears, so a listener
re-reads the truth from PostgreSQL when nudged and now and then regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator

import redis
import redis.asyncio as aioredis
from django.conf import settings

logger = logging.getLogger(__name__)

# A listener's queue is bounded: a nudge more while one is pending carries no news.
_QUEUE_SIZE = 1

# ThreadChannelHub: how long its listener blocks on Redis before it looks at what to
# (un)subscribe (also the longest a new watch waits for its subscription to be asked
# for), how long `watch` waits for the subscription before it goes on without it, and
# the pause before a reconnection.
_POLL_S = 0.1
SUBSCRIBE_TIMEOUT_S = 1.0
_RECONNECT_PAUSE_S = 1.0


class ChannelHub:
    """One process's (one event loop's) subscriptions, shared by its listeners."""

    def __init__(self, url: str):
        self._url = url
        self._client: aioredis.Redis | None = None
        self._pubsub = None
        self._reader: asyncio.Task | None = None
        self._listeners: dict[str, set[asyncio.Queue]] = {}
        self._lock = asyncio.Lock()

    def _ensure_pubsub(self) -> None:
        if self._pubsub is None:
            self._client = aioredis.Redis.from_url(
                self._url, socket_connect_timeout=1.0, health_check_interval=30
            )
            self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)

    def _ensure_reader(self) -> None:
        """Start the reader once something is subscribed (redis-py refuses to read a
        pub/sub connection before its first subscription)."""
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        """Deliver each message to the listeners of its channel; reconnect on errors (the
        listeners re-read on their own timer meanwhile)."""
        while True:
            try:
                if not self._listeners:
                    await asyncio.sleep(0.1)
                    continue
                message = await self._pubsub.get_message(timeout=1.0)
            except RuntimeError:  # not subscribed (any more): nothing to read yet
                await asyncio.sleep(0.1)
                continue
            except (aioredis.ConnectionError, aioredis.TimeoutError, OSError) as exc:
                logger.warning("stream hub lost Redis", extra={"error": type(exc).__name__})
                await asyncio.sleep(1.0)
                with contextlib.suppress(Exception):
                    channels = list(self._listeners)
                    if channels:
                        await self._pubsub.subscribe(*channels)
                continue
            if message is None or message.get("type") != "message":
                continue
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            for queue in self._listeners.get(channel, ()):
                if queue.full():  # a pending nudge is replaced: the latest one wins
                    queue.get_nowait()
                queue.put_nowait(message["data"])

    @contextlib.asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[asyncio.Queue]:
        """A queue that receives the channel's messages for as long as the block runs.
        If Redis is down the queue stays silent: callers poll on a timer anyway."""
        queue: asyncio.Queue = asyncio.Queue(_QUEUE_SIZE)
        async with self._lock:
            first = channel not in self._listeners
            self._listeners.setdefault(channel, set()).add(queue)
            try:
                self._ensure_pubsub()
                if first:
                    await self._pubsub.subscribe(channel)
                self._ensure_reader()
            except (aioredis.ConnectionError, aioredis.TimeoutError, OSError):
                logger.warning("stream hub cannot subscribe; polling only")
        try:
            yield queue
        finally:
            async with self._lock:
                listeners = self._listeners.get(channel)
                if listeners is not None:
                    listeners.discard(queue)
                    if not listeners:
                        del self._listeners[channel]
                        with contextlib.suppress(Exception):
                            await self._pubsub.unsubscribe(channel)

    @property
    def client(self) -> aioredis.Redis:
        """The hub's Redis client, for other reads of this loop (one connection pool)."""
        self._ensure_pubsub()
        return self._client

    @property
    def listener_count(self) -> int:
        return sum(len(queues) for queues in self._listeners.values())


_hubs: dict[int, ChannelHub] = {}


def channel_hub() -> ChannelHub:
    """This event loop's hub (one per loop: asyncio objects belong to their loop)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(id(loop))
    if hub is None:
        hub = _hubs[id(loop)] = ChannelHub(settings.REDIS_URL)
    return hub


class ThreadChannelHub:
    """One process's subscriptions for its threads: a channel's watchers are
    threading.Events, set by one listener thread that holds the process's connection
    (started with the first watch; it reconnects on any error, and the watchers' own
    timers go on meanwhile). Redis is `url`, or settings.REDIS_URL when it connects."""

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._watchers: dict[str, set[threading.Event]] = {}
        self._subscribed: dict[str, threading.Event] = {}  # set once the channel is live
        self._confirmed: set[str] = set()  # channels Redis confirmed and has not dropped
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watch(self, channel: str) -> Iterator[threading.Event]:
        """An event set whenever a message comes on the channel, for as long as the block
        runs. Waits (up to SUBSCRIBE_TIMEOUT_S) until the subscription is live, so that a
        message published after this returns is heard."""
        nudged = threading.Event()
        with self._lock:
            self._watchers.setdefault(channel, set()).add(nudged)
            live = self._subscribed.setdefault(channel, threading.Event())
            if channel in self._confirmed:  # still subscribed for an earlier watcher
                live.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="pubsub-listener", daemon=True
                )
                self._thread.start()
        if not live.wait(SUBSCRIBE_TIMEOUT_S):
            logger.info("not subscribed to %s in time: going on without it", channel)
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
                        self._url or settings.REDIS_URL,
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
            except Exception as exc:  # Redis lost (or worse): the watchers' timers go on
                logger.warning("pub/sub listener lost Redis: %s", type(exc).__name__)
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
            if message["type"] == "subscribe":  # from now on a message published is heard
                self._confirmed.add(channel)
                live = self._subscribed.get(channel)
                if live is not None:
                    live.set()
            elif message["type"] == "unsubscribe":
                self._confirmed.discard(channel)
            elif message["type"] == "message":
                for nudged in self._watchers.get(channel, ()):
                    nudged.set()
