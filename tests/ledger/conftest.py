import pytest
import redis
from django.conf import settings

from apps.ledger import services


@pytest.fixture(autouse=True)
def capture_every_report(settings):
    """The ledger's own scenarios check the capture arithmetic report by report, so
    they capture on every report; test_capture_cadence.py checks the once-a-minute
    cadence that the platform runs with."""
    settings.GANTRY_LEDGER_CAPTURE_INTERVAL_S = 0


@pytest.fixture
def usage_redis():
    """The Redis of the batched usage path, emptied before and after the test."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def assert_ledger_consistent():
    """Call at the end of a scenario: the reconciler must find nothing."""

    def check():
        violations = services.reconcile(record=False)
        assert violations == [], "\n".join(map(str, violations))

    return check
