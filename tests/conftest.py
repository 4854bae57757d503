import pytest
from rest_framework.test import APIClient

from apps.core import wakeup
from tests.factories import OrgFactory, operator_key, org_key
from tests.scheduler.factories import broker


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
