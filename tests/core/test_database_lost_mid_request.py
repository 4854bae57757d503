"""PostgreSQL lost in the middle of a request is a 503 with Retry-After, never a 500, and
the next request gets a new connection.

Found by killing the embedded PostgreSQL under `make up` while tenants submitted: the
submission's hot statements run on psycopg directly (apps.core.sql.execute, the ledger's
pipelines), so "server closed the connection unexpectedly" arrived as psycopg's own
OperationalError, which the 503 handler, knowing only Django's, answered with a 500.
Here the API's own backend is terminated between two submissions, as a PostgreSQL
restart or a failover terminates it.
"""

from __future__ import annotations

import json

import pytest
from django.db import DEFAULT_DB_ALIAS, connection, connections

from apps.jobs.models import Job
from apps.ledger.models import Hold, HoldState
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, org_key
from tests.jobs.factories import demo_gpu_types, grant_credits, spec_body

pytestmark = pytest.mark.django_db(transaction=True)


def submit(client, key: str):
    body = json.dumps(spec_body(project="video", params={"prompt": "fox"}))
    return client.generic(
        "POST", "/v1/jobs", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def terminate_this_connections_backend() -> None:
    """From a second connection made from the same settings (TCP or the embedded
    server's Unix socket), as a PostgreSQL restart or a failover would."""
    pid = connection.connection.info.backend_pid
    other = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            assert cursor.fetchone()[0]
    finally:
        other.close()


def test_a_backend_terminated_before_a_submission_is_a_503_and_the_retry_is_served():
    demo_gpu_types()
    org = OrgFactory()
    ProjectFactory(org=org, name="video")
    grant_credits(org)
    client = client_with(org_key(org))
    assert submit(client, "first").status_code == 202  # caches warm: the key, the project

    terminate_this_connections_backend()
    lost = submit(client, "second")
    assert lost.status_code == 503, lost.content
    assert lost.json()["error"]["code"] == "unavailable"
    assert int(lost["Retry-After"]) > 0

    retried = submit(client, "second")
    assert retried.status_code == 202, retried.content
    assert Job.objects.filter(org=org).count() == 2
    assert Hold.objects.filter(org=org, state=HoldState.ACTIVE).count() == 2
