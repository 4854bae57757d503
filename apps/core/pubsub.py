"""Redis pub/sub fanned out to many asyncio listeners over one connection per process.

Each open stream (a tenant following a job) waits on an asyncio queue, not on a
connection of its own: a process holds one Redis connection for all its listeners,
subscribes a channel while someone listens to it and drops it when the last one leaves.
Messages are nudges ("look again"), not state: pub/sub forgets what nobody hears, so a
listener re-reads the truth from PostgreSQL when nudged and now and then regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from django.conf import settings

logger = logging.getLogger(__name__)

# A listener's queue is bounded: a nudge more while one is pending carries no news.
_QUEUE_SIZE = 1


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
