"""Factories and helpers for the scheduler tests: a fleet, queued jobs, running jobs."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import timedelta

import factory
import redis
from django.conf import settings
from django.db.models.functions import Now
from django.utils import timezone

from apps.core import wakeup
from apps.jobs.models import Attempt, AttemptState, Job, JobStatus
from apps.jobs.services.lifecycle import transition
from tests.factories import OrgFactory, ProjectFactory
from tests.fleet.factories import A100_PRICE as A100_PRICE  # re-exported for the scheduler tests
from tests.fleet.factories import H100_PRICE as H100_PRICE
from tests.fleet.factories import NodeFactory as NodeFactory
from tests.fleet.factories import gpu_types as gpu_types
from tests.fleet.factories import unique_name as unique_name


class JobFactory(factory.django.DjangoModelFactory):
    """A queued job as submission leaves it (no hold unless `hold=` is given)."""

    class Meta:
        model = Job

    org = factory.SubFactory(OrgFactory)
    project = factory.LazyAttribute(lambda job: ProjectFactory(org=job.org))
    user = None
    tier = factory.LazyAttribute(lambda job: job.org.tier)
    status = JobStatus.QUEUED
    params = factory.Sequence(lambda n: {"prompt": f"scene {n}", "steps": 5})
    gpu_count = 1
    gpu_types = factory.LazyFunction(lambda: ["H100"])
    max_runtime_s = 600
    preemptible = True
    fingerprint = factory.LazyAttribute(
        lambda job: hashlib.sha256(repr(sorted(job.params.items())).encode()).hexdigest()
    )
    queued_at = factory.LazyFunction(timezone.now)


def queued_since(seconds: float, **fields) -> Job:
    """A queued job that has been waiting `seconds` (queued and created that long ago)."""
    at = timezone.now() - timedelta(seconds=seconds)
    job = JobFactory(queued_at=at, **fields)
    Job.objects.filter(pk=job.pk).update(created_at=at)
    job.refresh_from_db()
    return job


def start_attempt(attempt: Attempt, *, ran_for_s: float = 0.0) -> Attempt:
    """What the worker's claim does: attempt scheduled → running, job → running.

    `ran_for_s` backdates the start, as if the job had been running that long."""
    started = timezone.now() - timedelta(seconds=ran_for_s)
    claimed = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.SCHEDULED).update(
        state=AttemptState.RUNNING,
        started_at=started,
        worker="test-worker",
        lease_expires_at=Now() + timedelta(minutes=5),
    )
    assert claimed == 1
    transition(
        attempt.job_id,
        to=JobStatus.RUNNING,
        only_from=[JobStatus.SCHEDULED],
        reason="claimed by test-worker",
        actor="worker:test",
        attempt=attempt,
        changes={"started_at": started},
    )
    attempt.refresh_from_db()
    return attempt


def live_attempt(job: Job) -> Attempt | None:
    return Attempt.objects.filter(job=job).exclude(state=AttemptState.FINISHED).first()


def broker() -> redis.Redis:
    """The Celery broker (Redis) the tests publish run messages to."""
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def dispatch_ticks(client: redis.Redis) -> list[dict]:
    """Headers of the dispatch ticks waiting on the control queue, oldest first."""
    raw_messages = reversed(client.lrange("control", 0, -1))
    headers = [json.loads(raw)["headers"] for raw in raw_messages]
    return [header for header in headers if header["task"] == wakeup.DISPATCH_TASK]


def queue_length(node_name: str) -> int:
    """Messages waiting on the node's Celery queue (kombu's Redis list `node.<name>`)."""
    return broker().llen(f"node.{node_name}")


def clear_queue(node_name: str) -> None:
    broker().delete(f"node.{node_name}")


def run_messages(node_name: str) -> list[tuple[str, list]]:
    """(task name, args) of every message waiting on the node's queue, oldest first."""
    out = []
    for raw in reversed(broker().lrange(f"node.{node_name}", 0, -1)):  # LPUSH: newest first
        message = json.loads(raw)
        args = json.loads(base64.b64decode(message["body"]))[0]
        out.append((message["headers"]["task"], args))
    return out


def subprocess_database_url() -> str:
    """The URL of pytest-django's test database, for processes the tests start."""
    from tests.worker_harness import worker_database_url

    return worker_database_url()
