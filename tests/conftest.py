import threading

import pytest
from django.db import connections
from rest_framework.test import APIClient

from apps.core import wakeup
from apps.jobs.views import STREAM_READ_THREADS, STREAM_READS
from tests.factories import OrgFactory, operator_key, org_key
from tests.scheduler.factories import broker


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's test database, and before it is dropped the connections the
    stream views' reader threads keep between reads (CONN_MAX_AGE) closed: an open one
    would block the drop ("database test_gantry is being accessed by other users")."""
    yield
    all_there = threading.Barrier(STREAM_READ_THREADS)

    def close_this_threads_connections():
        # Each of the pool's threads takes one of these and waits for the others, so
        # that every thread runs one; fewer threads than that break the barrier in 2 s.
        try:
            all_there.wait(timeout=2)
        except threading.BrokenBarrierError:
            pass
        finally:
            connections.close_all()

    closes = [
        STREAM_READS.submit(close_this_threads_connections) for _ in range(STREAM_READ_THREADS)
    ]
    for done in closes:
        done.result()


def client_with(raw_key: str | None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def anonymous():
    return APIClient()


@pytest.fixture
def operator(db):
    return client_with(operator_key())


@pytest.fixture
def org(db):
    return OrgFactory()


@pytest.fixture
def tenant(org):
    """An API client holding a key of `org`."""
    return client_with(org_key(org))


@pytest.fixture
def control_queue(monkeypatch):
    """The Celery `control` queue on the real broker, with the dispatcher's wake-up keys
    and rerun ask cleared before and after, and this process knowing of no queued
    wake-up (as a fresh process)."""
    client = broker()
    keys = ("control", wakeup.WINDOW_KEY, wakeup.TRAILING_KEY, wakeup.RERUN_KEY)
    client.delete(*keys)
    monkeypatch.setattr(wakeup, "_covered_until", 0.0)
    yield client
    client.delete(*keys)
