"""The job state machine: every legal transition works, every illegal one changes nothing."""

import pytest

from apps.jobs.models import TERMINAL_STATUSES, Job, JobEvent, JobStatus
from apps.jobs.services.lifecycle import ALLOWED, IllegalTransition, transition
from apps.jobs.services.outcomes import end_job, move_job
from apps.jobs.services.webhooks import enqueue_delivery
from apps.ledger.models import HoldState
from tests.jobs.factories import JobFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_job_state")]

ALL = [s.value for s in JobStatus]
LEGAL = sorted((src, dst) for src, targets in ALLOWED.items() for dst in targets)
ILLEGAL = sorted(
    (src, dst) for src in ALL for dst in ALL if dst not in ALLOWED.get(src, frozenset())
)


def test_the_table_covers_every_status():
    assert set(ALLOWED) | set(TERMINAL_STATUSES) == set(ALL)
    assert not set(ALLOWED) & set(TERMINAL_STATUSES), "terminal states are final"
    assert len(LEGAL) + len(ILLEGAL) == len(ALL) ** 2


@pytest.mark.parametrize(("src", "dst"), LEGAL)
def test_every_legal_transition_moves_the_job_and_logs_it(org, src, dst):
    job = JobFactory(org=org, status=src, with_hold=True)
    events_before = JobEvent.objects.filter(job=job).count()

    moved = move_job(job.id, to=dst, reason=f"test {src}->{dst}", actor="test")

    assert moved.status == dst
    stored = Job.objects.select_related("hold").get(pk=job.pk)
    assert stored.status == dst
    last = JobEvent.objects.filter(job=job).order_by("id").last()
    assert JobEvent.objects.filter(job=job).count() == events_before + 1
    assert (last.from_status, last.to_status, last.actor) == (src, dst, "test")
    if dst in TERMINAL_STATUSES:
        assert stored.finished_at is not None
        # Nothing ran, so the hold went back whole; exactly once.
        assert stored.hold.state == HoldState.RELEASED
        assert stored.hold.refunded == stored.hold.amount
    else:
        assert stored.finished_at is None
        assert stored.hold.state == HoldState.ACTIVE


@pytest.mark.parametrize(("src", "dst"), ILLEGAL)
def test_every_illegal_transition_is_refused_and_changes_nothing(org, src, dst):
    job = JobFactory(org=org, status=src, with_hold=True)
    events_before = JobEvent.objects.filter(job=job).count()
    hold_before = (job.hold.state, job.hold.captured, job.hold.refunded)

    with pytest.raises(IllegalTransition):
        move_job(job.id, to=dst, reason="should not happen", actor="test")

    stored = Job.objects.select_related("hold").get(pk=job.pk)
    assert stored.status == src
    assert JobEvent.objects.filter(job=job).count() == events_before
    assert (stored.hold.state, stored.hold.captured, stored.hold.refunded) == hold_before


def test_only_from_narrows_the_legal_sources(org):
    job = JobFactory(org=org, status=JobStatus.PREEMPTING)
    with pytest.raises(IllegalTransition):
        transition(job.id, to=JobStatus.SUCCEEDED, reason="x", actor="t", only_from=["running"])
    assert Job.objects.get(pk=job.pk).status == JobStatus.PREEMPTING


def test_a_job_walks_the_long_way_round_to_success(org):
    job = JobFactory(org=org, with_hold=True)
    path = ["scheduled", "running", "preempting", "queued", "scheduled", "running", "succeeded"]
    for status in path:
        transition(job.id, to=status, reason="walk", actor="test")
    steps = list(
        JobEvent.objects.filter(job=job).order_by("id").values_list("from_status", "to_status")
    )
    assert steps == [("", "queued"), *zip(["queued", *path[:-1]], path, strict=True)]
    with pytest.raises(IllegalTransition):
        transition(job.id, to="cancelled", reason="too late", actor="test")


def test_a_terminal_transition_queues_the_webhook_on_commit(
    org, django_capture_on_commit_callbacks
):
    with_hook = JobFactory(org=org, status=JobStatus.RUNNING, webhook_url="https://hooks.test/x")
    without = JobFactory(org=org, status=JobStatus.RUNNING)

    with django_capture_on_commit_callbacks() as callbacks:
        end_job(without.id, to=JobStatus.FAILED, reason="crashed", actor="test")
    assert not [cb for cb in callbacks if getattr(cb, "func", None) is enqueue_delivery]

    with django_capture_on_commit_callbacks() as callbacks:
        transition(with_hook.id, to=JobStatus.PREEMPTING, reason="make room", actor="test")
    assert not [cb for cb in callbacks if getattr(cb, "func", None) is enqueue_delivery]

    job = JobFactory(org=org, status=JobStatus.RUNNING, webhook_url="https://hooks.test/y")
    with django_capture_on_commit_callbacks() as callbacks:
        end_job(job.id, to=JobStatus.SUCCEEDED, reason="done", actor="test")
    hooks = [cb for cb in callbacks if getattr(cb, "func", None) is enqueue_delivery]
    assert [cb.args for cb in hooks] == [(job.id,)]
