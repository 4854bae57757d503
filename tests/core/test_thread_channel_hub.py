"""A process's threads watch Redis channels over one connection (real Redis): a message
sets the watchers of its channel and no other's, a channel nobody watches any more is
dropped, and without Redis a watch goes on after its timeout."""

from __future__ import annotations

import threading
import time
import uuid

import redis
from django.conf import settings

from apps.core.pubsub import SUBSCRIBE_TIMEOUT_S, ThreadChannelHub
from tests.worker_harness import free_port


def channel() -> str:
    return f"gantry:test-hub:{uuid.uuid4()}"


def subscribers(client: redis.Redis, name: str) -> int:
    [(_, count)] = client.pubsub_numsub(name)
    return count


def test_a_message_sets_every_watcher_of_its_channel_and_no_other():
    hub, client = ThreadChannelHub(), redis.Redis.from_url(settings.REDIS_URL)
    one, other = channel(), channel()
    with hub.watch(one) as first, hub.watch(one) as second, hub.watch(other) as elsewhere:
        assert subscribers(client, one) == 1  # one connection for the process's watchers
        client.publish(one, b"look")
        assert first.wait(5) and second.wait(5)
        assert not elsewhere.wait(0.3)


def test_watchers_in_many_threads_share_the_hub_and_each_hears_its_own_channel():
    hub, client = ThreadChannelHub(), redis.Redis.from_url(settings.REDIS_URL)
    names = [channel() for _ in range(8)]
    heard: dict[str, bool] = {}
    ready = threading.Barrier(len(names) + 1)

    def watcher(name: str) -> None:
        with hub.watch(name) as nudged:
            ready.wait(10)
            heard[name] = nudged.wait(5)

    threads = [threading.Thread(target=watcher, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    ready.wait(10)
    for name in names:
        client.publish(name, b"look")
    for thread in threads:
        thread.join(10)
    assert heard == dict.fromkeys(names, True)


def test_a_channel_no_longer_watched_is_unsubscribed():
    hub, client = ThreadChannelHub(), redis.Redis.from_url(settings.REDIS_URL)
    name = channel()
    with hub.watch(name):
        assert subscribers(client, name) == 1
    deadline = time.monotonic() + 5
    while subscribers(client, name):
        assert time.monotonic() < deadline, "still subscribed after the watch ended"
        time.sleep(0.05)


def test_without_redis_a_watch_goes_on_after_its_timeout():
    hub = ThreadChannelHub(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    started = time.monotonic()
    with hub.watch(channel()) as nudged:
        waited = time.monotonic() - started
        assert not nudged.is_set()
    assert SUBSCRIBE_TIMEOUT_S <= waited < SUBSCRIBE_TIMEOUT_S + 2
