"""GET /v1/audit: one timeline over ledger entries, job events, dispatch decisions and
operator actions, newest first, for operators only."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.models import OperatorAction
from apps.audit.selectors import RANK, SUBKINDS, AuditFilters, parse_kinds
from apps.jobs.models import JobEvent
from apps.ledger.models import Entry
from apps.scheduler.models import DispatchDecision
from tests.jobs.factories import reset_job_state
from tests.ops.audit_world import funded, platform, submitted

pytestmark = pytest.mark.django_db

URL = "/v1/audit"


@pytest.fixture(autouse=True)
def _fresh_state(db, settings):
    """Known GPU types and empty rate-limit buckets (Redis is shared across tests); a fast
    password hasher for the admin's test user (autouse runs before admin_client)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    reset_job_state()


def read(client, **params) -> dict:
    response = client.get(URL, params)
    assert response.status_code == 200, response.json()
    return response.json()


def walk(client, **params) -> list[dict]:
    """Every row, following `next` to the end."""
    rows, cursor = [], None
    while True:
        page = read(client, **params, **({"cursor": cursor} if cursor else {}))
        rows += page["results"]
        cursor = page["next"]
        if cursor is None:
            return rows


def order_key(row: dict):
    source, pk = row["id"].split(":")
    return (row["at"], RANK[source], int(pk))


def test_an_org_key_is_refused_and_no_key_is_401(tenant, anonymous):
    refused = tenant.get(URL)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    assert anonymous.get(URL).status_code == 401


def test_the_operator_sees_all_four_sources_merged_newest_first(operator):
    world = platform()

    rows = read(operator, limit=200)["results"]

    assert {row["source"] for row in rows} == {"operator", "dispatch", "job", "ledger"}
    assert rows == sorted(rows, key=order_key, reverse=True)
    assert len({row["id"] for row in rows}) == len(rows)
    placed = next(row for row in rows if row["kind"] == "dispatch.place")
    assert placed["job"] == str(world.running.pk) and placed["org"] == str(world.paid.pk)
    assert placed["data"]["node"] == world.busy_node.name and placed["reason"]
    preempt = next(row for row in rows if row["kind"] == "dispatch.preempt")
    assert preempt["data"]["victims"] == [str(world.running.pk)]
    assert preempt["reason"] == "waited past the tier's preemption threshold"
    hold = next(row for row in rows if row["kind"] == "ledger.hold")
    assert hold["data"]["from"] == "available" and hold["data"]["to"] == "held"
    assert hold["data"]["amount"] > 0
    action = next(row for row in rows if row["source"] == "operator")
    assert (action["actor"], action["kind"]) == ("admin:someone", "operator.node.drain")


def test_rows_of_different_times_interleave_across_sources(operator):
    org = funded("clock", "paid")
    job = submitted(org)  # held, then queued: both stamped "now" (statement time)
    hour = timedelta(hours=1)
    now = timezone.now()
    JobEvent.objects.create(
        at=now - hour, job=job, from_status="queued", to_status="queued", reason="a note", actor="t"
    )
    OperatorAction.objects.create(
        at=now - 3 * hour,
        actor="admin:ann",
        action="job.cancel",
        target_type="job",
        target_id=str(job.pk),
        job_id=job.pk,
    )
    DispatchDecision.objects.create(
        at=now - 2 * hour,
        tick=uuid.uuid4(),
        kind="reserve",
        outcome="skipped",
        job=job,
        node_name="n1",
        reason="blocked 4-GPU job",
        skip_reason="node busy",
    )

    rows = read(operator, job=str(job.pk))["results"]

    kinds = [row["kind"] for row in rows]
    older = ["job.note", "dispatch.reserve", "operator.job.cancel"]
    assert kinds == ["job.queued", "ledger.hold", *older]
    assert "skipped: node busy" in rows[3]["summary"]


def test_paging_by_cursor_visits_every_row_once_in_the_same_order(operator):
    platform()
    everything = read(operator, limit=200)["results"]
    assert read(operator, limit=200)["next"] is None

    paged = walk(operator, limit=3)

    # The legs of one ledger INSERT share an instant: the cursor's tie-break must hold.
    assert [row["id"] for row in paged] == [row["id"] for row in everything]


def test_filters_by_org_job_and_kind(operator):
    world = platform()

    free = walk(operator, org=str(world.free.pk), limit=50)
    assert free and {row["org"] for row in free} == {str(world.free.pk)}
    about_running = walk(operator, job=str(world.running.pk))
    assert {row["job"] for row in about_running} == {str(world.running.pk), str(world.waiting.pk)}
    # The preemption is listed under its victim too (the job it makes room for is `waiting`).
    assert [row["kind"] for row in about_running].count("dispatch.preempt") == 1
    preempts = walk(operator, kind="dispatch.preempt")
    assert [row["kind"] for row in preempts] == ["dispatch.preempt"]
    mixed = walk(operator, kind="operator,ledger.hold")
    assert {row["kind"] for row in mixed} == {"operator.node.drain", "ledger.hold"}
    transitions = walk(operator, kind="job.running")
    assert [row["job"] for row in transitions] == [str(world.running.pk)]


def test_since_is_inclusive_and_until_exclusive(operator):
    platform()
    now = timezone.now()
    hour = timedelta(hours=1)
    everything = walk(operator, limit=200)

    assert walk(operator, since=(now - hour).isoformat(), limit=200) == everything
    assert walk(operator, until=(now + hour).isoformat(), limit=200) == everything
    assert walk(operator, since=(now + hour).isoformat()) == []
    assert walk(operator, until=(now - hour).isoformat()) == []
    instant = everything[0]["at"]  # the newest
    at_instant = [row for row in everything if row["at"] == instant]
    assert walk(operator, since=instant, limit=200) == at_instant
    assert walk(operator, until=instant, limit=200) == everything[len(at_instant) :]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "last tuesday"}, "since"),
        ({"until": "2026-13-01T00:00:00Z"}, "until"),
        ({"since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "until"),
        ({"org": "not-a-uuid"}, "org"),
        ({"org": str(uuid.uuid4())}, "org"),
        ({"job": str(uuid.uuid4())}, "job"),
        ({"kind": "dispatch.teleport"}, "kind"),
        ({"cursor": "bm90IGEgY3Vyc29y"}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "5000"}, "limit"),
    ],
)
def test_bad_filters_are_400_naming_the_field(operator, params, field):
    response = operator.get(URL, params)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_a_page_reads_a_bounded_number_of_rows_per_source(operator):
    org = funded("busy", "paid")
    for n in range(30):
        submitted(org, prompt=f"scene {n}")

    with CaptureQueriesContext(connection) as queries:
        page = read(operator, limit=5)

    assert len(page["results"]) == 5 and page["next"]
    tables = (
        "accounts_operatoraction",
        "scheduler_dispatchdecision",
        "jobs_jobevent",
        "ledger_entry",
    )
    reads = [
        q["sql"] for q in queries.captured_queries if any(f'FROM "{t}"' in q["sql"] for t in tables)
    ]
    assert len(reads) == 4 and all(sql.rstrip().endswith("LIMIT 6") for sql in reads)
    assert Entry.objects.count() > 60  # far more history than the page read


def test_the_default_trail_leaves_metering_out_and_all_brings_it_back():
    default = AuditFilters()
    assert default.subkinds("ledger") == frozenset(SUBKINDS["ledger"]) - {"capture"}
    assert default.subkinds("dispatch") is None and default.subkinds("job") is None
    everything = AuditFilters(kinds=parse_kinds("all"))
    assert everything.subkinds("ledger") is None
    assert AuditFilters(kinds=parse_kinds("ledger.capture")).subkinds("ledger") == {"capture"}
