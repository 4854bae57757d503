"""Two checks run over every endpoint of the public API, from one table each.

- Another tenant's ids answer 404 (never 403, never the object), and nothing changes.
- Every list endpoint walks page by page through its cursor: each item once, the same
  set as one large page, and `next` ends as null.

A new endpoint belongs in these tables: the checks are the same for all of them.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import urlencode

import pytest

from apps.jobs.models import Job, JobEvent, JobStatus, QuarantinedFingerprint
from apps.ledger import services as ledger
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, UserFactory, org_key
from tests.jobs.factories import JobFactory, demo_gpu_types, grant_credits

pytestmark = pytest.mark.django_db

# (method, path): {org} is another org's id, {job} a job of another org (or project).
OTHER_ORGS_OBJECTS = [
    ("get", "/v1/orgs/{org}"),
    ("get", "/v1/orgs/{org}/projects"),
    ("get", "/v1/orgs/{org}/users"),
    ("get", "/v1/balance?org={org}"),
    ("get", "/v1/ledger/entries?org={org}"),
    ("get", "/v1/jobs/{job}"),
    ("get", "/v1/jobs/{job}/events"),
    ("get", "/v1/jobs/{job}/result"),
    ("post", "/v1/jobs/{job}/cancel"),
]
# A project-scoped key and a job of another project of the same org.
OTHER_PROJECTS_OBJECTS = [
    ("get", "/v1/jobs/{job}"),
    ("get", "/v1/jobs/{job}/events"),
    ("get", "/v1/jobs/{job}/result"),
    ("post", "/v1/jobs/{job}/cancel"),
]


def _untouched(job: Job) -> None:
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and not job.cancel_requested
    assert job.events.count() == 1


@pytest.mark.parametrize(("method", "path"), OTHER_ORGS_OBJECTS)
def test_another_orgs_object_is_404_and_unchanged(tenant, method, path):
    other = OrgFactory()
    job = JobFactory(org=other, status=JobStatus.SUCCEEDED)
    response = getattr(tenant, method)(path.format(org=other.id, job=job.id), format="json")
    assert response.status_code == 404, (path, response.content)
    assert response.json()["error"]["code"] == "not_found"
    assert str(other.id) not in response.content.decode()
    _untouched(job)


@pytest.mark.parametrize(("method", "path"), OTHER_PROJECTS_OBJECTS)
def test_another_projects_job_is_404_to_a_project_key_and_unchanged(org, method, path):
    mine, theirs = ProjectFactory(org=org), ProjectFactory(org=org)
    client = client_with(org_key(org, project=mine))
    job = JobFactory(org=org, project=theirs, status=JobStatus.SUCCEEDED)
    response = getattr(client, method)(path.format(job=job.id), format="json")
    assert response.status_code == 404, (path, response.content)
    assert response.json()["error"]["code"] == "not_found"
    _untouched(job)


def _world(org):
    """Three or more of everything a list endpoint lists, for `org` and for another org."""
    other = OrgFactory()
    for owner in (org, other):
        for _ in range(3):
            ProjectFactory(org=owner)
            UserFactory(org=owner)
            org_key(owner)
            grant_credits(owner, amount=1_000_000)
        jobs = [JobFactory(org=owner) for _ in range(3)]
        for n in range(3):
            JobEvent.objects.create(
                job=jobs[0], from_status="queued", to_status="queued", reason=f"{n}", actor="test"
            )
        if owner == org:
            mine = jobs[0]
        for n in range(3):
            QuarantinedFingerprint.objects.create(
                fingerprint=f"{owner.pk.hex}{n:032x}",
                reason="hung on 2 nodes",
                node_count=2,
                sample_job=jobs[n],
            )
    return mine


def _node_body(n: int) -> dict:
    return {"name": f"walk-{n}", "gpus": [{"type": "H100"}]}


# (who, path, at least): who is "tenant" or "operator"; {org} is the tenant's org, {job}
# its job; at least: how many items the world gives that list (a tenant sees one org).
LISTS = [
    ("tenant", "/v1/orgs", 1),
    ("tenant", "/v1/orgs/{org}/projects", 3),
    ("tenant", "/v1/orgs/{org}/users", 3),
    ("tenant", "/v1/api-keys", 3),
    ("tenant", "/v1/ledger/entries", 3),
    ("tenant", "/v1/jobs", 3),
    ("tenant", "/v1/jobs/{job}/events", 3),
    ("operator", "/v1/orgs", 2),
    ("operator", "/v1/api-keys", 3),
    ("operator", "/v1/ledger/entries?org={org}", 3),
    ("operator", "/v1/fleet/nodes", 3),
    ("operator", "/v1/quarantine", 3),
]


def _key(item: dict) -> str:
    return str(item.get("id") or item.get("name") or json.dumps(item, sort_keys=True))


def _walk(client, path: str, *, limit: int) -> tuple[list[str], int]:
    """Follow `next` (an opaque token, passed back as ?cursor=) until it is null."""
    separator = "&" if "?" in path else "?"
    first = f"{path}{separator}limit={limit}"
    url, seen, pages = first, [], 0
    while url:
        response = client.get(url)
        assert response.status_code == 200, (url, response.content)
        body = response.json()
        assert set(body) == {"results", "next"}
        assert len(body["results"]) <= limit
        seen += [_key(item) for item in body["results"]]
        pages += 1
        url = body["next"] and f"{first}&cursor={body['next']}"
        assert pages < 100, "the cursor never ends"
    return seen, pages


@pytest.mark.parametrize(("who", "path", "at_least"), LISTS)
def test_every_list_walks_its_cursor_to_the_end_seeing_each_item_once(
    org, tenant, operator, who, path, at_least
):
    job = _world(org)
    ledger.grant(org=org, amount=5, kind="paid")
    if "fleet" in path:
        demo_gpu_types()
        for n in range(3):
            assert operator.post("/v1/fleet/nodes", _node_body(n), format="json").status_code == 201
    client = tenant if who == "tenant" else operator
    path = path.format(org=org.id, job=job.id)
    everything, _ = _walk(client, path, limit=500)
    assert len(everything) >= at_least, path
    walked, pages = _walk(client, path, limit=1)
    assert pages >= len(everything)
    assert len(walked) == len(set(walked)), f"{path}: an item came twice"
    assert sorted(walked) == sorted(everything), path


# Tokens a client could forge: base64 of what `encode_cursor` never makes. A position
# that is no value of the list's first ordering field (a time, or for the fleet's nodes
# a name) must not reach PostgreSQL as a literal it refuses.
FORGED_CURSORS = [
    ("p=a\x00b", "any"),
    ("o=-5&p=x", "any"),
    ("p=notadate", "time"),
    ("p=2026-13-45", "time"),
    ("p=2026-12-03 07:21:53.335947 00:00", "time"),  # a "+" read back as a space
    ("p=" + "9" * 400, "time"),
    ("p=9999-12-31T23:59:59-14:00", "time"),  # past year 9999 in UTC
]


@pytest.mark.parametrize(
    ("who", "path", "forged"),
    [
        (who, path, forged)
        for who, path, _ in LISTS
        for forged, ordered_by in FORGED_CURSORS
        # the fleet's nodes are listed by name: any text but a NUL is a position
        if ordered_by == "any" or "fleet" not in path
    ],
)
def test_a_forged_cursor_is_a_400_naming_cursor_on_every_list(
    org, tenant, operator, who, path, forged
):
    job = _world(org)
    client = tenant if who == "tenant" else operator
    path = path.format(org=org.id, job=job.id)
    token = base64.b64encode(forged.encode()).decode()
    separator = "&" if "?" in path else "?"
    response = client.get(f"{path}{separator}{urlencode({'cursor': token})}")
    assert response.status_code == 400, (path, forged, response.content)
    assert response.json()["error"]["field"] == "cursor"
    # The list itself still answers.
    assert client.get(path).status_code == 200
