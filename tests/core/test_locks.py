"""Singleton locks a silent holder cannot keep: the session of a process that holds a
session lock and stops talking (its host cut off) ends itself after
GANTRY_LOCK_IDLE_TIMEOUT_S, so another process takes over within that bound."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from apps.core import locks

pytestmark = pytest.mark.django_db(transaction=True)


def in_thread(fn):
    """Run fn on its own thread, so on its own database session; return its result."""
    out = {}

    def body():
        try:
            out["value"] = fn()
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=30)
    return out["value"]


class Holder:
    """A process that holds a LeaderLock on its own session and then falls silent."""

    def __init__(self, name: str):
        self.lock = locks.LeaderLock(name)
        self.go, self.done = threading.Event(), threading.Event()
        self.answers: list[bool] = []
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        try:
            self.answers.append(self.lock.hold())
            self.done.set()
            self.go.wait(timeout=30)  # silent: no statement on its session meanwhile
            self.answers.append(self.lock.hold())
        finally:
            connections.close_all()
            self.done.set()

    def start(self):
        self.thread.start()
        self.done.wait(timeout=30)
        self.done.clear()
        return self

    def speak_again(self) -> bool:
        self.go.set()
        self.thread.join(timeout=30)
        return self.answers[-1]


def test_a_leader_that_falls_silent_loses_the_lock_within_the_idle_timeout(settings):
    settings.GANTRY_LOCK_IDLE_TIMEOUT_S = 0.5
    holder = Holder("test:leader").start()
    assert holder.answers == [True]
    standby = locks.LeaderLock("test:leader")
    assert standby.hold() is False  # the leader's session still holds it

    taken_after = None
    started = time.monotonic()
    while time.monotonic() - started < 10:
        if standby.hold():
            taken_after = time.monotonic() - started
            break
        time.sleep(0.1)
    assert taken_after is not None and taken_after < 3.0

    # The old leader comes back: its session was ended, so it leads no more.
    assert holder.speak_again() is False
    assert standby.hold() is True
    standby.release()


def test_a_leader_that_keeps_talking_keeps_the_lock_and_its_session(settings):
    settings.GANTRY_LOCK_IDLE_TIMEOUT_S = 0.5
    leader = locks.LeaderLock("test:talking")
    for _ in range(8):  # 1.6 s, three times the idle timeout, never silent for long
        assert leader.hold() is True
        assert in_thread(lambda: locks.LeaderLock("test:talking").hold()) is False
        time.sleep(0.2)
    leader.release()
    assert in_thread(lambda: locks.LeaderLock("test:talking").hold()) is True


def test_a_session_lock_gives_the_session_its_idle_timeouts_back(settings):
    settings.GANTRY_LOCK_IDLE_TIMEOUT_S = 3
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_session_timeout")
        before = cursor.fetchone()[0]
    with locks.try_session_lock("test:timeouts") as held:
        assert held
        with connection.cursor() as cursor:
            cursor.execute("SHOW idle_session_timeout")
            assert cursor.fetchone()[0] == "3s"
            cursor.execute("SHOW idle_in_transaction_session_timeout")
            assert cursor.fetchone()[0] == "3s"
    with connection.cursor() as cursor:
        cursor.execute("SHOW idle_session_timeout")
        assert cursor.fetchone()[0] == before
