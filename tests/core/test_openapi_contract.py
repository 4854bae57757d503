"""The API answers what its OpenAPI schema (/v1/schema/) says: schemathesis, in the suite.

Schemathesis reads the schema the running application serves and sends every operation
generated requests (the schema's examples, then coverage cases: boundaries, missing
and malformed values, undeclared methods, then fuzzed ones), to the real application
(its WSGI handler, in process) on the real database (committed transactions, as in
production: `transaction=True`), once with a tenant key and once with an operator key.

The world: an enterprise org with credits, a project, a user, a key bound to that
project (the tenant), an operator key, a queued job with its hold, a succeeded job
with a result, a failed (dead-lettered) job, a quarantined fingerprint, the demo GPU
types and a node of two H100s.

Every check schemathesis has for a single request runs, and the test wants zero
failures from each:

- not_a_server_error: no 5xx;
- status_code_conformance, content_type_conformance, response_schema_conformance,
  response_headers_conformance: the answer is one the schema documents;
- negative_data_rejection: a request the schema calls invalid is refused (4xx);
- positive_data_acceptance: a request the schema calls valid is not refused with a
  400 (or 402, see below);
- missing_required_header, ignored_auth: no key is a 401, a required header missing a
  400; unsupported_method and allow_header_conformance: an undeclared method is a 405
  with `Allow`.

Left out, and why:

- use_after_free and ensure_resource_availability (and object_level_authorization)
  need schemathesis's stateful phase, which its pytest integration does not run; a
  tenant's view of another tenant's objects is tests/core/test_every_endpoint.py's.
- GET /v1/jobs/{job_id}/stream and /logs are documented but not sent: an answer is a
  stream that lasts until the job ends (the job streams have their own tests).

What the schema cannot say, and the test supplies to the *positive* cases only (a
request the schema calls valid, before it is sent): ids that exist (a path's org, job,
key or node, and the org, project, user or job a body or a filter names: any
well-formed UUID is valid by the schema, a missing one is a 400 or 404; a requeue names
the failed job, a lifted quarantine the quarantined fingerprint, a price change an
existing GPU type unless the body has the `memory_gb` a new one needs), a cursor the API
made (opaque), `until` after `since`, a grant's expiry in the future, GPU types of
the fleet (a node's GPUs, a job's `gpu_types` and a memory floor one of them meets), and
no webhook (its host must resolve to a public address: no DNS here). A 402 is accepted
for valid data: whether an org can pay is not the request's shape. Negative cases go as
generated.

Bounded: a few examples per operation, derandomized, so the run is the same each time.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import MutableMapping
from datetime import UTC, datetime, timedelta

import hypothesis
import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application

from apps.accounts.models import Tier
from apps.accounts.services import issue_api_key
from apps.jobs.models import Job, JobStatus, QuarantinedFingerprint
from apps.jobs.services import results
from tests.factories import OrgFactory, ProjectFactory, UserFactory
from tests.fleet.factories import NodeFactory
from tests.jobs.factories import JobFactory, demo_gpu_types, grant_credits

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA_PATH = "/v1/schema/"
NOT_FUZZED = r"/v1/jobs/\{job_id\}/(stream|logs)$"  # long-lived answers: see the docstring
# Fuzzed examples per operation (after the schema's examples and the coverage cases);
# GANTRY_CONTRACT_EXAMPLES=200 for a deeper run.
EXAMPLES_PER_OPERATION = int(os.environ.get("GANTRY_CONTRACT_EXAMPLES", "8"))
CREDITS = 2**60
KNOWN_GPU_TYPES = ("H100", "A100")
SMALLEST_GPU_MEMORY_GB = 40
# A well-formed Idempotency-Key (its schema); such a key is made unique per request.
IDEMPOTENCY_KEY = re.compile(r"[\x20-\x7e]{0,255}")
PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)


class World:
    """What the generated requests point at."""

    def __init__(self, tmp_path):
        demo_gpu_types()
        self.org = OrgFactory(tier=Tier.ENTERPRISE)
        grant_credits(self.org, amount=CREDITS)
        self.project = ProjectFactory(org=self.org, name="render")
        self.user = UserFactory(org=self.org, name="alice")
        self.tenant_key = issue_api_key(org=self.org, project=self.project).raw_key
        self.operator_key = issue_api_key(operator=True, name="contract").raw_key
        self.spare_key = issue_api_key(org=self.org, name="to revoke").api_key
        self.queued_job = JobFactory(org=self.org, project=self.project, with_hold=True)
        self.done_job = JobFactory(org=self.org, project=self.project, status=JobStatus.SUCCEEDED)
        output = tmp_path / "out.png"
        output.write_bytes(PNG)
        Job.objects.filter(pk=self.done_job.pk).update(
            result_path=results.store_result(self.done_job, output)
        )
        self.done_job.refresh_from_db()
        self.failed_job = JobFactory(org=self.org, project=self.project, status=JobStatus.FAILED)
        self.quarantined = QuarantinedFingerprint.objects.create(
            fingerprint="f" * 64, reason="hung on 2 nodes", node_count=2, sample_job=self.done_job
        )
        self.node = NodeFactory(gpus=2)
        self.spare_node = NodeFactory(gpus=1)  # for DELETE

    def key(self, caller: str) -> str:
        return self.tenant_key if caller == "tenant" else self.operator_key


@pytest.fixture
def world(tmp_path, settings):
    settings.MEDIA_ROOT = tmp_path / "media"
    return World(tmp_path)


@pytest.fixture(params=["tenant", "operator"])
def caller(request):
    return request.param


@pytest.fixture
def api_schema(world, caller):
    config = schemathesis.Config.from_dict(
        {
            "seed": int(os.environ.get("GANTRY_CONTRACT_SEED", "18")),
            "auth": {"openapi": {"BearerAuth": {"bearer": world.key(caller)}}},
            "checks": {
                "enabled": True,
                "positive_data_acceptance": {
                    "expected-statuses": ["2xx", "3xx", "401", "402", "403", "404", "409", "429"]
                },
            },
            "generation": {
                "max-examples": EXAMPLES_PER_OPERATION,
                "deterministic": True,
                # A NUL or a lone surrogate anywhere in a body is a 400 (docs/api.md).
                "allow-x00": False,
                "codec": "utf-8",
            },
        }
    )
    return schemathesis.openapi.from_wsgi(SCHEMA_PATH, get_wsgi_application(), config=config)


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request):
    """schemathesis 4.32's fixture-loaded schema reads `Node._nodeid`, which pytest 9.2
    no longer has (it names the subtests with it)."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path_regex=NOT_FUZZED)


@schema.parametrize()
@hypothesis.settings(
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    database=None,
)
def test_the_api_answers_as_its_schema_says(case, world, caller):
    fresh_idempotency_key(case)
    if case.meta is not None and case.meta.generation.mode.is_positive:
        steer(case, world, caller)
    case.call_and_validate()


def fresh_idempotency_key(case) -> None:
    """A well-formed, non-blank Idempotency-Key becomes a new one: the schema cannot say
    that a key must not have been used with another body (that is a 409, which would
    answer before the body is read). Malformed keys are sent as generated."""
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and key.strip() and IDEMPOTENCY_KEY.fullmatch(key):
        case.headers["Idempotency-Key"] = uuid.uuid4().hex


def steer(case, world: World, caller: str) -> None:
    """Point a valid request at objects that exist (see the module docstring)."""
    path, method = case.operation.path, case.method.upper()
    params = case.path_parameters or {}
    if "org" in params:
        params["org"] = str(world.org.id)
    if "job_id" in params:
        if path.endswith("/cancel"):
            job = world.queued_job
        elif path.endswith("/requeue"):
            job = world.failed_job
        else:
            job = world.done_job
        params["job_id"] = str(job.id)
    if "key_id" in params:
        params["key_id"] = str(world.spare_key.id)
    if path == "/v1/fleet/gpu-types/{name}":
        body = case.body if isinstance(case.body, MutableMapping) else {}
        if "memory_gb" not in body:  # a price change: of a type that exists
            params["name"] = KNOWN_GPU_TYPES[0]
    elif "name" in params:
        params["name"] = (world.spare_node if method == "DELETE" else world.node).name
    if "fingerprint" in params:
        params["fingerprint"] = world.quarantined.fingerprint
    if "token" in params:
        params["token"] = results.signed_result_link(world.done_job).path.rsplit("/", 1)[1]

    if caller == "operator" and path in ("/v1/balance", "/v1/ledger/entries"):
        case.query = {**(case.query or {}), "org": ""}  # operators name the org
    query = case.query if isinstance(case.query, MutableMapping) else None
    if query is not None:
        query.pop("cursor", None)
        if "org" in query:
            query["org"] = str(world.org.id)
        if "job" in query:
            query["job"] = str(world.done_job.id)
        if "project" in query:
            by_id = caller == "operator" and path == "/v1/jobs"
            query["project"] = str(world.project.id) if by_id else world.project.name
        if path == "/v1/audit":
            query.pop("kind", None)
            since, until = query.get("since"), query.get("until")
            if since and until and _instant(until) <= _instant(since):
                query.pop("until")

    body = case.body if isinstance(case.body, MutableMapping) else None
    if body is None:
        return
    for field, value in (("org", world.org.id), ("user", world.user.id)):
        if body.get(field) is not None:
            body[field] = str(value)
    if body.get("project") is not None:
        body["project"] = world.project.name if path == "/v1/jobs" else str(world.project.id)
    if path == "/v1/api-keys" and method == "POST":
        if body.get("operator"):
            for field in ("org", "project", "user"):
                body.pop(field, None)
        else:
            body["org"] = str(world.org.id)
    if path == "/v1/credits/grants" and body.get("expires_at") is not None:
        body["expires_at"] = (datetime.now(UTC) + timedelta(days=30)).isoformat()
    if path == "/v1/fleet/nodes" and isinstance(body.get("gpus"), list):
        for gpu in body["gpus"]:
            if isinstance(gpu, dict):
                gpu["type"] = _known_gpu_type(gpu.get("type"))
    if path == "/v1/jobs":
        body.pop("webhook_url", None)
        body.pop("webhook_events", None)
        resources = body.get("resources")
        if isinstance(resources, dict):
            if isinstance(resources.get("gpu_types"), list):
                resources["gpu_types"] = [_known_gpu_type(t) for t in resources["gpu_types"]]
            if isinstance(resources.get("min_gpu_memory_gb"), int):
                resources["min_gpu_memory_gb"] = min(
                    resources["min_gpu_memory_gb"], SMALLEST_GPU_MEMORY_GB
                )


def _known_gpu_type(name) -> str:
    return name if name in KNOWN_GPU_TYPES else KNOWN_GPU_TYPES[0]


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
