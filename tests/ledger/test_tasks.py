"""Periodic tasks: scheduled with an expiry, thin, and harmless when run twice at once."""

import threading

import pytest
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now

from apps.core import locks
from apps.ledger import services, tasks
from apps.ledger.models import Bucket, Hold
from config.celery import app
from tests.factories import OrgFactory
from tests.ledger.factories import CREDIT, BucketFactory, HoldFactory

pytestmark = pytest.mark.django_db


def test_every_ledger_task_is_scheduled_with_an_expiry_and_registered():
    app.loader.import_default_modules()
    BEAT_SCHEDULE = {
        name: entry
        for name, entry in settings.CELERY_BEAT_SCHEDULE.items()
        if entry["task"].startswith("gantry.ledger.")
    }
    assert {entry["task"] for entry in BEAT_SCHEDULE.values()} == {
        "gantry.ledger.fold_usage_reports",
        "gantry.ledger.expire_buckets",
        "gantry.ledger.expire_stale_holds",
        "gantry.ledger.reconcile",
    }
    for entry in BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks
        assert 0 < entry["options"]["expires"] <= 2 * entry["schedule"]
    assert BEAT_SCHEDULE["ledger-fold-usage-reports"]["schedule"] <= 2


def test_the_expiry_tasks_expire_buckets_and_recover_stale_holds():
    org = OrgFactory()
    bucket = BucketFactory(org=org, granted=5 * CREDIT)
    hold = HoldFactory(org=org, amount=CREDIT)
    Bucket.objects.filter(pk=bucket.pk).update(expires_at=Now())
    Hold.objects.filter(pk=hold.pk).update(expires_at=Now())
    assert tasks.expire_buckets() == 1
    assert tasks.expire_stale_holds() == 1
    assert (tasks.expire_buckets(), tasks.expire_stale_holds()) == (0, 0)
    bucket.refresh_from_db()
    assert (bucket.remaining, bucket.expired) == (0, 5 * CREDIT)


def test_a_fold_while_another_one_is_running_returns_at_once(usage_redis):
    org = OrgFactory()
    BucketFactory(org=org)
    hold = HoldFactory(org=org)
    services.record_usage(hold_id=hold.pk, attempt_key="", cumulative_usage=5, seq=1)
    running, done = threading.Event(), threading.Event()

    def other_fold():  # holds the fold's lock from its own session, as a second worker would
        with locks.try_session_lock("gantry.ledger.fold_usage_reports") as acquired:
            assert acquired
            running.set()
            done.wait(timeout=30)
        connection.close()

    thread = threading.Thread(target=other_fold)
    thread.start()
    assert running.wait(timeout=30)
    try:
        assert tasks.fold_usage_reports() == 0
        assert services.pending_usage_reports() == 1
    finally:
        done.set()
        thread.join()
    assert tasks.fold_usage_reports() == 1
    assert tasks.fold_usage_reports() == 0
