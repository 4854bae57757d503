"""wake_dispatcher on the real broker: at once after a quiet window, else one wake-up at
the end of the window for all of its commits, never one per commit."""

import time

import pytest

from apps.core import wakeup
from tests.scheduler.factories import dispatch_ticks

pytestmark = pytest.mark.django_db

# A window long enough that the test's own pace cannot cross it by accident.
WINDOW_MS = 1000
WINDOW_S = WINDOW_MS / 1000


@pytest.fixture(autouse=True)
def long_window(monkeypatch, control_queue):
    monkeypatch.setattr(wakeup, "DEBOUNCE_MS", WINDOW_MS)
    yield
    # wake_dispatcher sends nothing to the control queue but dispatch ticks.
    assert len(dispatch_ticks(control_queue)) == control_queue.llen("control")


@pytest.fixture
def commit_asking_for_a_tick(django_capture_on_commit_callbacks):
    def commit():
        with django_capture_on_commit_callbacks(execute=True):
            wakeup.wake_dispatcher()

    return commit


def test_a_burst_of_commits_shares_one_tick_per_window_and_a_quiet_one_is_sent_at_once(
    control_queue, commit_asking_for_a_tick, monkeypatch
):
    commit_asking_for_a_tick()
    [first] = dispatch_ticks(control_queue)
    assert first["eta"] is None  # after a quiet window: at once

    # GPUs freed just after it must not wait for the 1 s tick: one tick is queued for the
    # end of the window, and every other commit of the window shares it.
    commit_asking_for_a_tick()
    commit_asking_for_a_tick()  # this process knows of it: not even a Redis round trip
    monkeypatch.setattr(wakeup, "_covered_until", 0.0)  # another process asks Redis
    commit_asking_for_a_tick()
    first, trailing = dispatch_ticks(control_queue)
    assert trailing["eta"] is not None
    assert 0 < control_queue.pttl(wakeup.TRAILING_KEY) <= WINDOW_MS
    # That tick opens the next window: a commit in it waits for that window's end.
    assert control_queue.pttl(wakeup.WINDOW_KEY) > WINDOW_MS

    time.sleep(WINDOW_S * 1.5)  # in the next window
    commit_asking_for_a_tick()
    assert [tick["eta"] is None for tick in dispatch_ticks(control_queue)] == [True, False, False]

    time.sleep(WINDOW_S * 2)  # a quiet window: at once again
    commit_asking_for_a_tick()
    assert [tick["eta"] is None for tick in dispatch_ticks(control_queue)] == [
        True,
        False,
        False,
        True,
    ]
