"""wake_dispatcher on the real broker: one wake-up at once per debounce window, and one
more at the window's end for the commits that came within it, never one per commit."""

import json
import time

import pytest

from apps.core import wakeup
from tests.scheduler.factories import broker

pytestmark = pytest.mark.django_db


@pytest.fixture
def control_queue(monkeypatch):
    """The control queue and the debounce keys, emptied; this process knowing of no
    queued wake-up (as a fresh process)."""
    client = broker()
    client.delete("control", wakeup.DEBOUNCE_KEY, wakeup.TRAILING_KEY)
    monkeypatch.setattr(wakeup, "_covered_until", 0.0)
    yield client
    client.delete("control", wakeup.DEBOUNCE_KEY, wakeup.TRAILING_KEY)


def dispatch_messages(client) -> list[dict]:
    """Headers of the dispatch ticks waiting on the control queue, oldest first."""
    headers = [json.loads(raw)["headers"] for raw in reversed(client.lrange("control", 0, -1))]
    assert {header["task"] for header in headers} <= {wakeup.DISPATCH_TASK}
    return headers


def commit_asking_for_a_tick(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        wakeup.wake_dispatcher()


def test_commits_within_the_window_share_one_trailing_tick_and_later_ones_wake_it_again(
    control_queue, django_capture_on_commit_callbacks, monkeypatch
):
    commit_asking_for_a_tick(django_capture_on_commit_callbacks)
    [first] = dispatch_messages(control_queue)
    assert first["eta"] is None  # at once

    # A GPU freed 1 ms later must not wait for the 1 s tick: a second tick is queued for
    # the end of the window, and every other commit of the window shares it.
    commit_asking_for_a_tick(django_capture_on_commit_callbacks)
    commit_asking_for_a_tick(django_capture_on_commit_callbacks)
    monkeypatch.setattr(wakeup, "_covered_until", 0.0)  # another process: it asks Redis
    commit_asking_for_a_tick(django_capture_on_commit_callbacks)
    first, trailing = dispatch_messages(control_queue)
    assert trailing["eta"] is not None
    assert 0 < control_queue.pttl(wakeup.TRAILING_KEY) <= wakeup.DEBOUNCE_MS

    time.sleep(wakeup.DEBOUNCE_MS / 1000 + 0.05)  # the window is over: at once again
    commit_asking_for_a_tick(django_capture_on_commit_callbacks)
    messages = dispatch_messages(control_queue)
    assert len(messages) == 3 and messages[2]["eta"] is None
