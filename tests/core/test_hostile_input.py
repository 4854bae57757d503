"""Hostile input gets a JSON 4xx naming what is wrong, never a 500, and holds nothing.

Each case is a body or URL a client could send (a lone surrogate, a NUL, 5,000 levels of
nesting, a number JSON cannot hold, 20 MB, a 20,000-character URL, a foreign Host); a
property test throws arbitrary JSON at every write endpoint. PostgreSQL out of reach is
a 503 with Retry-After.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.core.redis import reset_redis_client
from apps.ledger.models import Hold
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, org_key
from tests.jobs.factories import demo_gpu_types, grant_credits, spec_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def funded(db):
    demo_gpu_types()
    org = OrgFactory()
    ProjectFactory(org=org, name="video")
    grant_credits(org)
    return client_with(org_key(org)), org


def post_raw(client, path: str, text: str, **extra):
    return client.generic(
        "POST",
        path,
        text.encode("utf-8", "surrogatepass"),
        content_type="application/json",
        **extra,
    )


def submit_text(client, text: str, key: str = "k-1"):
    return post_raw(client, "/v1/jobs", text, HTTP_IDEMPOTENCY_KEY=key)


def assert_refused(response, status: int, code: str, field: str | None = None):
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code, error
    if field is not None:
        assert error["field"] == field, error
        assert error["message"].startswith(field)


def job_text(**params) -> str:
    return json.dumps(spec_body(project="video", params={"prompt": "fox", **params}))


def test_a_lone_surrogate_in_params_is_a_400_naming_the_field_and_holds_nothing(funded):
    client, _ = funded
    text = job_text().replace('"fox"', '"fox \\ud800"')
    assert_refused(submit_text(client, text), 400, "malformed", "params.prompt")
    assert not Hold.objects.exists()


@pytest.mark.parametrize(
    ("text_of", "field"),
    [
        (lambda t: t.replace('"fox"', '"fo\\u0000x"'), "params.prompt"),
        (lambda t: t.replace('"prompt"', '"pro\\u0000mpt"'), "params"),
        (lambda t: t.replace('"seed": 7', '"seed": 1e999'), "params.seed"),
    ],
    ids=["nul-in-a-value", "nul-in-a-key", "infinite-number"],
)
def test_what_postgresql_cannot_store_is_refused_at_the_door(funded, text_of, field):
    client, _ = funded
    text = job_text(seed=7)
    assert_refused(submit_text(client, text_of(text)), 400, "malformed", field)
    assert not Hold.objects.exists()


def test_a_number_with_thousands_of_digits_is_malformed_not_a_crash(funded):
    client, _ = funded
    text = job_text(seed=7).replace('"seed": 7', '"seed": ' + "9" * 5000)
    assert_refused(submit_text(client, text), 400, "malformed")
    assert not Hold.objects.exists()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/jobs"),
        ("POST", "/v1/orgs"),
        ("PUT", "/v1/budgets"),
        ("POST", "/v1/jobs/00000000-0000-0000-0000-000000000000/cancel"),
        ("POST", "/v1/credits/grants"),
        ("PUT", "/v1/fleet/gpu-types/H100"),
    ],
)
def test_json_nested_5000_deep_is_a_400_on_every_write_endpoint(funded, operator, method, path):
    client, _ = funded
    text = "[" * 5000 + "]" * 5000
    for caller in (client, operator):
        response = caller.generic(
            method, path, text, content_type="application/json", HTTP_IDEMPOTENCY_KEY="deep"
        )
        assert response.status_code in (400, 403, 404), (path, response.content)
        assert response.json()["error"]["code"] in ("malformed", "forbidden", "not_found")
    assert not Hold.objects.exists()


def test_nesting_within_the_limit_is_stored_and_deeper_is_refused_with_its_path(funded, settings):
    client, _ = funded
    settings.GANTRY_GENERATOR_PARAMS_SCHEMA = ""  # a generator that takes any params
    deep_ok = {"a": {"b": {"c": [1, [2, [3]]]}}}
    response = submit_text(client, job_text(extra=deep_ok), key="ok")
    assert response.status_code == 202, response.content
    too_deep: object = 1
    for _ in range(40):
        too_deep = [too_deep]
    response = submit_text(client, job_text(extra=too_deep), key="deep")
    assert_refused(response, 400, "malformed")
    assert "nested deeper than" in response.json()["error"]["message"]
    assert Hold.objects.count() == 1


def test_a_body_over_the_size_limit_is_a_json_413_before_it_is_read(funded, settings):
    client, _ = funded
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    text = job_text(padding="x" * 4096)
    assert_refused(submit_text(client, text), 413, "too_large")
    assert not Hold.objects.exists()


def test_a_20000_character_url_is_a_json_414(funded):
    client, _ = funded
    assert_refused(client.get("/v1/jobs?project=" + "p" * 20_000), 414, "uri_too_long")


def test_a_foreign_host_is_a_json_400(funded):
    client, _ = funded
    assert_refused(client.get("/v1/balance", HTTP_HOST="evil.example"), 400, "bad_request")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/jobs?status=%00",
        "/v1/jobs?project=a%00b",
        "/v1/ledger/entries?job=%00",
        "/v1/jobs/%00",
        "/v1/jobs?project=%ED%A0%80",
    ],
)
def test_a_nul_or_a_bad_byte_in_the_url_is_a_json_400(funded, path):
    client, _ = funded
    response = client.get(path)
    assert response.status_code in (400, 404), response.content
    assert response.json()["error"]["code"] in ("malformed", "not_found", "invalid")


@pytest.mark.django_db(transaction=True)
def test_postgresql_out_of_reach_is_a_503_with_retry_after(funded):
    client, _ = funded
    real_port = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = "1"  # nothing listens there
    try:
        for path in ("/v1/balance", "/v1/jobs"):
            response = client.get(path)
            assert_refused(response, 503, "unavailable")
            assert int(response["Retry-After"]) > 0
        response = submit_text(client, job_text())
        assert_refused(response, 503, "unavailable")
    finally:
        connection.close()
        connection.settings_dict["PORT"] = real_port
    assert client.get("/v1/balance").status_code == 200
    assert not Hold.objects.exists()


# -- the property: arbitrary JSON at every write endpoint ----------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
job_like = st.fixed_dictionaries(
    {},
    optional={
        "project": st.one_of(st.just("video"), st.text(max_size=20), json_values),
        "params": st.one_of(
            st.fixed_dictionaries(
                {"prompt": st.text(max_size=30)},
                optional={"steps": json_values, "seed": json_values, "step_seconds": json_values},
            ),
            json_values,
        ),
        "resources": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "gpu_count": json_values,
                    "gpu_types": json_values,
                    "min_gpu_memory_gb": json_values,
                },
            ),
            json_values,
        ),
        "max_runtime_s": json_values,
        "preemptible": json_values,
        "webhook_url": st.one_of(st.text(max_size=40), json_values),
        "start_deadline_s": json_values,
        "webhook_events": json_values,
    },
)
WRITE_ENDPOINTS = [
    ("POST", "/v1/jobs"),
    ("POST", "/v1/orgs"),
    ("POST", "/v1/orgs/{org}/projects"),
    ("POST", "/v1/orgs/{org}/users"),
    ("POST", "/v1/api-keys"),
    ("POST", "/v1/credits/grants"),
    ("PUT", "/v1/budgets"),
    ("POST", "/v1/jobs/{job}/cancel"),
    ("POST", "/v1/jobs/{job}/requeue"),
    ("PUT", "/v1/fleet/gpu-types/H100"),
    ("PUT", "/v1/fleet/gpu-types/L40S"),
]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    endpoint=st.sampled_from(WRITE_ENDPOINTS),
    body=st.one_of(job_like, json_values),
    as_operator=st.booleans(),
    key=st.text(min_size=1, max_size=40),
)
def test_no_write_endpoint_answers_5xx_to_arbitrary_json_and_a_refusal_holds_nothing(
    funded, operator, endpoint, body, as_operator, key
):
    client, org = funded
    method, path = endpoint
    job_id = "00000000-0000-0000-0000-000000000000"
    holds_before = Hold.objects.count()
    caller = operator if as_operator else client
    text = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    response = caller.generic(
        method,
        path.format(org=org.id, job=job_id),
        text,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key.encode("utf-8", "surrogatepass").decode("latin-1"),
    )
    assert response.status_code < 500, (method, path, body, response.content)
    assert response["Content-Type"].startswith("application/json"), response.content
    if response.status_code != 202:
        assert Hold.objects.count() == holds_before


def test_redis_out_of_reach_never_makes_a_500(funded, settings):
    client, _ = funded
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    reset_redis_client()
    try:
        submitted = submit_text(client, job_text())
        assert submitted.status_code in (202, 503), submitted.content
        if submitted.status_code == 503:
            assert int(submitted["Retry-After"]) > 0
        else:
            job = client.get(f"/v1/jobs/{submitted.json()['id']}")
            assert job.status_code == 200, job.content
        for path in ("/v1/balance", "/v1/jobs"):
            assert client.get(path).status_code in (200, 503), path
    finally:
        reset_redis_client()
