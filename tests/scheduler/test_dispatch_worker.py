"""The dispatch tick as Celery runs it: a real worker process on the control queue,
woken by wake_dispatcher, places the job and publishes its run message."""

import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from apps.core import wakeup
from apps.jobs.models import JobStatus
from config.celery import app
from tests import worker_harness as harness
from tests.scheduler.factories import (
    JobFactory,
    NodeFactory,
    broker,
    clear_queue,
    live_attempt,
    run_messages,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

CELERY = str(Path(sys.executable).parent / "celery")


@pytest.fixture
def control_worker(tmp_path):
    """`celery worker -Q control` on the test database, stopped after the test."""
    worker = harness.control_worker(tmp_path)
    yield worker.log_path
    worker.stop(grace=0)


def test_wake_dispatcher_makes_the_control_worker_place_the_job(control_worker):
    node = NodeFactory(gpus=1)
    clear_queue(node.name)
    job = JobFactory()
    broker().delete(wakeup.WINDOW_KEY)

    wakeup.wake_dispatcher()  # outside a transaction: published at once

    deadline = time.monotonic() + 30
    while job.status != JobStatus.SCHEDULED:
        assert time.monotonic() < deadline, control_worker.read_text()[-3000:]
        time.sleep(0.1)
        job.refresh_from_db()
    attempt = live_attempt(job)
    assert attempt.node == node
    while not run_messages(node.name):  # published just after the commit
        assert time.monotonic() < deadline, control_worker.read_text()[-3000:]
        time.sleep(0.05)
    assert run_messages(node.name) == [
        ("gantry.jobs.run_attempt", [str(attempt.pk), attempt.fencing_token])
    ]
    assert "gantry.scheduler.dispatch_tick" in control_worker.read_text()
    clear_queue(node.name)


def test_beat_runs_the_tick_about_every_second_on_the_control_queue_with_an_expiry():
    app.loader.import_default_modules()
    app.finalize()
    schedule = app.conf.beat_schedule

    tick = schedule["scheduler-dispatch-tick"]
    assert tick["task"] == "gantry.scheduler.dispatch_tick"
    assert tick["schedule"] == settings.GANTRY_DISPATCH_INTERVAL_S
    assert tick["options"]["queue"] == "control" and tick["options"]["expires"] > 0
    recover = schedule["scheduler-recover-unclaimed-attempts"]
    assert recover["task"] in app.tasks
    assert "gantry.scheduler.dispatch_tick" in app.tasks
