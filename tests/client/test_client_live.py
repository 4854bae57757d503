"""The `gantry` command line against the real API (pytest-django's live server, real
PostgreSQL and Redis): each error path a tenant can meet, and the everyday commands.

The client runs in-process through its main(argv), configured only the way a user
configures it (GANTRY_API_URL / GANTRY_API_KEY), and talks HTTP to the live server.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone

from apps.accounts.models import Org, Tier
from apps.jobs.models import Attempt, Job
from apps.jobs.streams import channel_of
from apps.ledger import services as ledger
from gantry_client.api import GantryAPI
from tests.factories import OrgFactory, ProjectFactory, operator_key, org_key
from tests.worker_harness import (
    ApiServer,
    Beat,
    apply_fast_settings,
    flush_test_redis,
    load_e2e_fleet,
    pool_fixture,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The WSGI live server consumes a stream's async iterator synchronously (Django warns
    # so); the platform routes streams to Django's async handler (config.asgi), as the
    # tests under "live streams" below do.
    pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators"),
]

logger = logging.getLogger(__name__)
MICRO = 1_000_000
# A small job: 60 s on one GPU holds at most 60/3600 h x 4 credits/h (H100) = 0.066667.
SMALL = ("--prompt", "a red fox in snow", "--steps", "3", "--max-runtime", "60")


@dataclass
class Tenant:
    org: Org
    key: str
    url: str

    def jobs(self):
        return Job.objects.filter(org=self.org)


@pytest.fixture
def api_url(live_server, settings):
    # Signed result links are built on PUBLIC_URL: point them at the live server.
    settings.PUBLIC_URL = live_server.url
    load_e2e_fleet()  # nodes e2e-h100 and e2e-a100, whose queues the test workers consume
    return live_server.url


@pytest.fixture
def tenant(api_url, monkeypatch) -> Tenant:
    """A paid org with a project-scoped key, configured for the client via the environment."""
    org = OrgFactory(tier=Tier.PAID)
    project = ProjectFactory(org=org, name="studio")
    key = org_key(org, project=project)
    monkeypatch.setenv("GANTRY_API_URL", api_url)
    monkeypatch.setenv("GANTRY_API_KEY", key)
    return Tenant(org=org, key=key, url=api_url)


def fund(org: Org, credits: int = 100, *, kind: str = "paid", expires_at=None):
    return ledger.grant(org=org, amount=credits * MICRO, kind=kind, expires_at=expires_at)


def submitted_id(run) -> str:
    """The job id from `gantry --json submit` output."""
    assert run.code == 0, run.err
    return run.json()["id"]


# -- error paths --------------------------------------------------------------------------


def test_unknown_key_is_401_saying_how_to_set_one(gantry, tenant, monkeypatch):
    monkeypatch.setenv("GANTRY_API_KEY", "gk_deadbeef_not-a-real-key-at-all")
    run = gantry("balance")
    assert run.code == 3
    assert "Not authenticated" in run.err
    assert "The key gk_deadbeef… (from GANTRY_API_KEY) was refused" in run.err
    assert "GANTRY_API_KEY" in run.err
    assert "gantry configure" in run.err


def test_nine_gpus_is_400_naming_the_field_and_its_flag(gantry, tenant):
    fund(tenant.org)
    run = gantry("submit", *SMALL, "--gpus", "9")
    assert run.code == 3
    assert "Invalid request: resources.gpu_count" in run.err
    assert "field: resources.gpu_count  (set with --gpus)" in run.err
    assert not tenant.jobs().exists()


def test_unknown_gpu_type_is_400_listing_the_known_ones(gantry, tenant):
    fund(tenant.org)
    run = gantry("submit", *SMALL, "--gpu-type", "TPUv9")
    assert run.code == 3
    assert "field: resources.gpu_types  (set with --gpu-type)" in run.err
    assert "TPUv9" in run.err
    assert "H100" in run.err


def test_no_credits_is_402_pointing_at_the_balance(gantry, tenant):
    run = gantry("submit", *SMALL)
    assert run.code == 3
    assert "Not enough credit: " in run.err
    assert "0.000000 credits available, 0.066667 credits requested" in run.err
    assert "µc" not in run.err
    assert "gantry balance" in run.err
    assert not tenant.jobs().exists()


def test_hard_budget_is_403(gantry, tenant):
    fund(tenant.org)
    operator = GantryAPI(tenant.url, operator_key())
    budget = {"org": str(tenant.org.id), "limit": 1, "period": "total", "mode": "hard"}
    operator.request("PUT", "/v1/budgets", body=budget)
    run = gantry("submit", *SMALL)
    assert run.code == 3
    assert "A hard budget would be exceeded" in run.err
    assert "> limit 0.000001 credits." in run.err
    assert "µc" not in run.err
    assert not tenant.jobs().exists()


def test_unknown_job_and_another_orgs_job_are_both_404(gantry, tenant, monkeypatch):
    fund(tenant.org)
    mine = submitted_id(gantry("--json", "submit", *SMALL))

    unknown = str(uuid.uuid4())
    run = gantry("status", unknown)
    assert run.code == 3
    assert f"No job {unknown}: it does not exist, or it belongs to another org." in run.err

    monkeypatch.setenv("GANTRY_API_KEY", org_key(OrgFactory()))
    for command in ("status", "cancel", "events", "result"):
        run = gantry(command, mine)
        assert run.code == 3, command
        assert f"job {mine}" in run.err.lower(), command
    assert Job.objects.get(pk=mine).status == "queued"


def test_cancel_a_queued_job_then_again_is_409(gantry, tenant):
    fund(tenant.org)
    job_id = submitted_id(gantry("--json", "submit", *SMALL))

    first = gantry("cancel", job_id)
    assert first.code == 0, first.err
    assert f"Cancelled job {job_id}." in first.out
    assert "Charged 0.000000, refunded" in first.out

    again = gantry("cancel", job_id)
    assert again.code == 3
    assert f"Cannot cancel job {job_id}: " in again.err
    assert "already finished" in again.err
    assert Job.objects.get(pk=job_id).status == "cancelled"


def test_same_idempotency_key_replays_and_a_different_body_is_409(gantry, tenant):
    fund(tenant.org)
    key = str(uuid.uuid4())
    first = gantry("--json", "submit", *SMALL, "--idempotency-key", key)
    replay = gantry("--json", "submit", *SMALL, "--idempotency-key", key)
    assert submitted_id(replay) == submitted_id(first)
    assert "This key was used before" in replay.err

    other = gantry("submit", *SMALL, "--seed", "8", "--idempotency-key", key)
    assert other.code == 3
    assert "This Idempotency-Key belongs to a different submission" in other.err
    assert tenant.jobs().count() == 1


def test_rate_limit_is_429_with_retry_after_and_retry_resubmits_once(gantry, tenant):
    fund(tenant.org)
    Org.objects.filter(pk=tenant.org.pk).update(rate_per_s=0.5, rate_burst=1)
    assert gantry("submit", *SMALL).code == 0

    refused = gantry("submit", *SMALL)
    assert refused.code == 3
    assert "Rate limited" in refused.err
    assert int(re.search(r"Retry after (\d+) s\.", refused.err).group(1)) >= 1
    assert "Pass --retry N" in refused.err

    retried = gantry("--json", "submit", *SMALL, "--retry", "3")
    job_id = submitted_id(retried)
    assert re.search(r"rate limited; retrying in \d+ s \(retry 1 of 3\)", retried.err)
    key = retried.err.split("Idempotency-Key: ", 1)[1].split()[0]
    assert Job.objects.get(pk=job_id).idempotency_key.endswith(f":{key}")  # project-scoped
    assert tenant.jobs().count() == 2


def test_result_of_a_job_that_has_not_succeeded_says_to_check_its_status(gantry, tenant):
    fund(tenant.org)
    job_id = submitted_id(gantry("--json", "submit", *SMALL))
    run = gantry("result", job_id, "-o", "out.gif")
    assert run.code == 3
    assert f"gantry status {job_id}" in run.err


# -- everyday commands --------------------------------------------------------------------


def test_balance_table_by_kind_with_upcoming_expirations(gantry, tenant):
    fund(tenant.org, 100)
    fund(tenant.org, 5, kind="promo", expires_at=timezone.now() + timedelta(days=3))
    fund(tenant.org, 2, kind="grant")
    job_id = submitted_id(gantry("--json", "submit", *SMALL))
    held = Job.objects.select_related("hold").get(pk=job_id).hold.amount

    run = gantry("balance")
    assert run.code == 0, run.err
    by_kind, expirations = run.out.split("\n\n", 1)
    rows = {line.split()[0]: line.split()[1:] for line in by_kind.splitlines()}
    assert rows["KIND"] == ["AVAILABLE", "HELD"]
    # The hold draws from the promo credit first: it expires first.
    assert rows["promo"] == [render_credits(5 * MICRO - held), render_credits(held)]
    assert rows["paid"] == ["100.000000", "0.000000"]
    assert rows["grant"] == ["2.000000", "0.000000"]
    assert rows["total"] == [render_credits(107 * MICRO - held), render_credits(held)]
    expiring = expirations.splitlines()
    assert expiring[0] == "Upcoming expirations:"
    assert expiring[1].split() == ["KIND", "REMAINING", "EXPIRES"]
    assert expiring[2].split()[:2] == ["promo", render_credits(5 * MICRO - held)]
    assert len(expiring) == 3

    raw = gantry("--json", "balance").json()
    assert raw["available"] == 107 * MICRO - held
    assert raw["by_kind"] == {"paid": 100 * MICRO, "promo": 5 * MICRO - held, "grant": 2 * MICRO}


def render_credits(micro: int) -> str:
    return f"{micro // MICRO}.{micro % MICRO:06d}"


def test_list_follows_cursors_and_filters_by_status(gantry, tenant):
    fund(tenant.org)
    ids = [submitted_id(gantry("--json", "submit", *SMALL, "--seed", str(n))) for n in range(3)]
    assert gantry("cancel", ids[0]).code == 0

    everything = gantry("--json", "list", "--all", "--page-size", "1")
    assert everything.code == 0, everything.err
    assert [job["id"] for job in everything.json()["results"]] == ids[::-1]
    assert everything.json()["next"] is None

    first_two = gantry("list", "--limit", "2", "--page-size", "1")
    assert first_two.code == 0
    lines = first_two.out.splitlines()
    assert lines[0].split()[:4] == ["ID", "STATUS", "PROGRESS", "PROJECT"]
    assert [line.split()[0] for line in lines[1:]] == [ids[2], ids[1]]
    assert [line.split()[3] for line in lines[1:]] == ["studio", "studio"]  # not its id
    assert "--all for every job" in first_two.err

    cancelled = gantry("--json", "list", "--status", "cancelled", "--project", "studio")
    assert [job["id"] for job in cancelled.json()["results"]] == [ids[0]]

    unknown_project = gantry("list", "--project", "nope")
    assert unknown_project.code == 3
    assert "field: project  (set with --project)" in unknown_project.err


def test_status_reads_the_job_for_people_and_raw_for_scripts(gantry, tenant):
    fund(tenant.org)
    job_id = submitted_id(
        gantry("--json", "submit", *SMALL, "--gpu-type", "A100", "--gpu-type", "H100")
    )
    job = Job.objects.select_related("hold").get(pk=job_id)

    shown = gantry("status", job_id)
    assert shown.code == 0, shown.err
    fields = dict(line.split(None, 1) for line in shown.out.splitlines())
    assert fields["Job"] == job_id
    assert fields["Status"] == "queued"
    assert fields["Tier"] == "paid"
    assert fields["Project"] == "studio"
    assert fields["GPUs"] == "1, not placed yet  (allowed: A100, H100)"
    assert fields["Credits"] == f"{render_credits(job.hold.amount)} held, 0.000000 charged, " + (
        "0.000000 refunded (active)"
    )

    raw = gantry("status", job_id, "--json").json()
    assert raw["hold"]["amount"] == job.hold.amount
    assert raw["resources"]["gpu_types"] == ["A100", "H100"]
    assert raw["project"] == str(job.project_id)  # scripts get the API's raw id


def test_events_list_each_transition_oldest_first(gantry, tenant):
    fund(tenant.org)
    job_id = submitted_id(gantry("--json", "submit", *SMALL))
    assert gantry("cancel", job_id).code == 0
    run = gantry("events", job_id)
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[0].split() == ["AT", "FROM", "TO", "REASON"]
    transitions = [line.split()[3:5] for line in lines[1:]]  # after the 3-part timestamp
    assert transitions == [["-", "queued"], ["queued", "cancelled"]]


def test_the_last_digits_of_an_id_name_the_one_job_that_ends_with_them(gantry, tenant):
    fund(tenant.org)
    ids = [submitted_id(gantry("--json", "submit", *SMALL, "--seed", str(n))) for n in range(3)]
    target = ids[1]
    # The shortest end no other job's id has: the random part of a time-ordered id.
    short = next(
        target[-n:]
        for n in range(4, 36)
        if sum(i.endswith(target[-n:]) or i.startswith(target[-n:]) for i in ids) == 1
    )

    shown = gantry("status", short)
    assert shown.code == 0, shown.err
    assert dict(line.split(None, 1) for line in shown.out.splitlines())["Job"] == target

    cancelled = gantry("cancel", short.upper())
    assert cancelled.code == 0, cancelled.err
    assert f"Cancelled job {target}." in cancelled.out
    assert Job.objects.get(pk=target).status == "cancelled"
    assert [j.status for j in Job.objects.filter(pk__in=[ids[0], ids[2]])] == ["queued"] * 2

    unknown = gantry("events", "ffffffff-ffff")
    assert unknown.code == 3
    assert "no job id that this key can see ends or starts with ffffffff-ffff" in unknown.err


def test_waiting_on_a_job_that_gets_cancelled_exits_1(gantry, tenant):
    fund(tenant.org)
    job_id = submitted_id(gantry("--json", "submit", *SMALL))
    assert gantry("cancel", job_id).code == 0
    run = gantry("wait", job_id, "--poll-max", "0.2")
    assert run.code == 1
    assert f"job {job_id} ended cancelled" in run.err


# -- with real GPU-pool workers -----------------------------------------------------------

workers = pool_fixture("e2e-h100")


@pytest.fixture
def running_stack(workers, settings, api_url):
    """Workers consuming the e2e-h100 queue and a beat ticking in the background."""
    apply_fast_settings(settings, workers)
    flush_test_redis()
    stop = threading.Event()

    def beat():
        try:
            while not stop.is_set():
                try:
                    Beat().tick()
                except Exception:  # a failed tick is retried by the next, as with real beat
                    logger.exception("test beat tick failed")
                stop.wait(0.1)
        finally:
            connection.close()  # this thread's connection, before the test database goes

    thread = threading.Thread(target=beat, name="test-beat", daemon=True)
    thread.start()
    yield workers
    # Leave no run behind for the next test: every attempt has finished.
    try:
        Beat().until(lambda: not Attempt.objects.exclude(state="finished").exists(), timeout=15)
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.mark.e2e
def test_submit_wait_follows_the_job_and_downloads_its_result(
    gantry, tenant, running_stack, tmp_path
):
    fund(tenant.org)
    target = tmp_path / "renders" / "fox.gif"
    run = gantry(
        "submit",
        "--prompt",
        "a red fox in snow",
        "--steps",
        "4",
        "--step-seconds",
        "0.05",
        "--max-runtime",
        "60",
        "--gpu-type",
        "H100",
        "--wait",
        "--poll-max",
        "0.3",
        "-o",
        target,
    )
    assert run.code == 0, f"{run.err}\n{running_stack.logs()}"
    job = Job.objects.select_related("hold").get(org=tenant.org)
    assert job.status == "succeeded"
    stored = Path(running_stack.media_root) / "results" / job.result_path
    assert target.read_bytes() == stored.read_bytes()
    assert target.read_bytes()[:6] == b"GIF89a"
    assert f"Submitted job {job.id} (queued)." in run.out
    assert (
        f"Job {job.id} succeeded; charged {render_credits(job.hold.captured)} credits." in run.out
    )
    assert f"Result saved to {target} ({target.stat().st_size} bytes)." in run.out
    progress_lines = [line for line in run.err.splitlines() if line.startswith(f"job {job.id}:")]
    assert progress_lines[-1].startswith(f"job {job.id}: succeeded 100% | attempt 1 | ")
    assert progress_lines[-1].endswith(f"| cost {render_credits(job.hold.captured)} credits")

    shown = dict(line.split(None, 1) for line in gantry("status", str(job.id)).out.splitlines())
    assert shown["Status"] == "succeeded (100%)"
    assert shown["GPUs"] == "1 x H100  (allowed: H100)"
    assert shown["Credits"].startswith(f"{render_credits(job.hold.amount)} held, ")
    assert shown["Result"] == f"ready, `gantry result {job.id}` to download"

    # The same result again, into a folder (a short id will do): the file's own name.
    again = gantry("result", str(job.id)[:13], "-o", f"{tmp_path}/again/")
    assert again.code == 0, again.err
    assert (tmp_path / "again" / "output.gif").read_bytes() == stored.read_bytes()


@pytest.mark.e2e
def test_submit_wait_on_a_job_that_keeps_crashing_exits_1_with_its_error(
    gantry, tenant, running_stack, tmp_path
):
    fund(tenant.org)
    run = gantry(
        "--json",
        "submit",
        "--prompt",
        "!crash",
        "--steps",
        "2",
        "--step-seconds",
        "0.05",
        "--max-runtime",
        "60",
        "--gpu-type",
        "H100",
        "--wait",
        "--poll-max",
        "0.3",
        "--no-progress",
        "-o",
        tmp_path / "never.gif",
    )
    job = Job.objects.get(org=tenant.org)
    assert run.code == 1, f"{run.err}\n{running_stack.logs()}"
    assert job.status == "failed"
    assert f"gantry: job {job.id} ended failed: {job.error_code}: " in run.err
    assert run.json()["status"] == "failed"
    assert run.json()["error"]["code"] == job.error_code
    assert not (tmp_path / "never.gif").exists()


# -- live streams, served as `make up` serves them ----------------------------------------
# pytest-django's live server is WSGI: it hands a stream over only once it is complete.
# These tests run the API under gunicorn and uvicorn (config.asgi), where every event
# goes out as it happens.


def launch_asgi_api(pool) -> ApiServer:
    """tests.worker_harness.ApiServer, with result links pointing at that server."""
    return ApiServer.launch(pool, public_url=True)


@pytest.fixture(scope="module")
def asgi_server(workers):
    server = launch_asgi_api(workers)
    yield server
    server.stop(grace=5)


@pytest.fixture
def asgi_stack(tenant, asgi_server, workers, settings, monkeypatch):
    """The tenant's client pointed at the ASGI API; a beat the test ticks itself."""
    beat = Beat.over(workers, settings)
    monkeypatch.setenv("GANTRY_API_URL", asgi_server.url)
    yield beat
    beat.drain(timeout=15, dispatch=True)


def in_background(gantry, *argv) -> tuple[threading.Thread, dict]:
    """gantry(*argv) in a thread; its Run lands in the dict under "run"."""
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(run=gantry(*argv)), daemon=True)
    thread.start()
    return thread, done


def until(condition, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def stream_listeners(job_id) -> int:
    """How many streams of this job are open now (PUBSUB NUMSUB of its channel)."""
    channel = channel_of(job_id)
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    return dict(client.pubsub_numsub(channel)).get(channel.encode(), 0)


@pytest.mark.e2e
def test_submit_wait_streams_queued_running_succeeded_with_progress_and_cost(
    gantry, tenant, asgi_stack, asgi_server, tmp_path
):
    fund(tenant.org)
    thread, done = in_background(
        gantry,
        *("submit", "--prompt", "a red fox in snow", "--steps", "10", "--step-seconds", "0.3"),
        *("--max-runtime", "60", "--gpu-type", "H100", "--wait", "-o", f"{tmp_path}/renders/"),
    )
    # Nothing is placed before the client follows the job on its stream: it sees it queued.
    until(lambda: tenant.jobs().exists())
    job = tenant.jobs().get()
    until(lambda: stream_listeners(job.id) >= 1)
    asgi_stack.until(lambda: Job.objects.get(pk=job.pk).is_terminal, timeout=60)
    thread.join(timeout=30)
    run = done["run"]
    job = Job.objects.select_related("hold").get(pk=job.pk)
    assert run.code == 0, f"{run.err}\n{asgi_server.log()[-3000:]}"
    assert job.status == "succeeded"

    lines = [line for line in run.err.splitlines() if line.startswith(f"job {job.id}: ")]
    assert re.match(rf"job {job.id}: queued \| (#\d+ )?in queue", lines[0]), lines
    running = [line for line in lines if line.startswith(f"job {job.id}: running ")]
    assert all(" | attempt 1 | on e2e-h100 (H100) | " in line for line in running), running
    shown = [int(re.search(r"running (\d+)%", line).group(1)) for line in running]
    # Every step the stream sent (at most two a second of ten 0.3 s steps), in order.
    assert shown == sorted(shown) and len(set(shown) - {0, 100}) >= 3, shown
    costs = [re.search(r"cost (\d+\.\d+) credits$", line).group(1) for line in lines]
    assert costs[-1] == render_credits(job.hold.captured) and job.hold.captured > 0
    assert lines[-1].startswith(f"job {job.id}: succeeded 100% | attempt 1 | on e2e-h100 (H100)")
    assert "µc" not in run.err + run.out
    saved = tmp_path / "renders" / "output.gif"
    assert f"Result saved to {saved} " in run.out
    assert saved.read_bytes()[:6] == b"GIF89a"

    # Followed on the stream, not by polling the job.
    until(lambda: f"/v1/jobs/{job.id}/stream HTTP" in asgi_server.log(), timeout=10)
    assert f'"GET /v1/jobs/{job.id} HTTP' not in asgi_server.log()


@pytest.mark.e2e
def test_logs_follow_a_running_attempt_then_read_back(gantry, tenant, asgi_stack, asgi_server):
    fund(tenant.org)
    job_id = submitted_id(
        gantry(
            *("--json", "submit", "--prompt", "a red fox in snow", "--steps", "6"),
            *("--step-seconds", "0.3", "--max-runtime", "60", "--gpu-type", "H100"),
        )
    )
    thread, done = in_background(gantry, "logs", job_id[:8], "-f")
    until(lambda: stream_listeners(job_id) >= 1)  # waiting for the first attempt
    asgi_stack.until(lambda: Job.objects.get(pk=job_id).is_terminal, timeout=60)
    thread.join(timeout=30)
    followed = done["run"]
    assert followed.code == 0, f"{followed.err}\n{asgi_server.log()[-3000:]}"
    assert f"Job {job_id} is queued: waiting for its first attempt to start." in followed.err
    progress = [line for line in followed.out.splitlines() if line.startswith("PROGRESS")]
    assert len(progress) >= 6, followed.out
    assert len(set(progress)) == len(progress)  # no line twice

    again = gantry("logs", job_id, "--attempt", "1")
    assert again.code == 0, again.err
    assert [line for line in again.out.splitlines() if line.startswith("PROGRESS")] == progress
    missing = gantry("logs", job_id, "--attempt", "9")
    assert missing.code == 3
    assert f"No log for job {job_id}: " in missing.err
