"""Params are checked at the door against the generator's schema.

Before: `steps: -3`, `steps: 1000000` and a missing prompt got 202, queued, took a GPU,
failed as `bad_input` and were charged. Now each is a 400 naming `params.…` with
nothing held, and the schema says exactly what the stand-in accepts (a property test
holds the two together).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.core.errors import GantryError
from apps.jobs.models import Job
from apps.jobs.services.params_schema import check_params
from apps.jobs.standin_generator import BadParams, load_params
from apps.ledger.models import Hold
from tests.conftest import client_with
from tests.factories import OrgFactory, ProjectFactory, org_key
from tests.jobs.factories import demo_gpu_types, grant_credits, spec_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant_with_credits(db):
    demo_gpu_types()
    org = OrgFactory()
    ProjectFactory(org=org, name="video")
    grant_credits(org)
    return client_with(org_key(org))


def submit(client, params):
    body = spec_body(project="video", params=params)
    return client.post("/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="k")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"prompt": "fox", "steps": -3}, "params.steps"),
        ({"prompt": "fox", "steps": 1_000_000}, "params.steps"),
        ({"prompt": "fox", "steps": "many"}, "params.steps"),
        ({"steps": 20}, "params.prompt"),
        ({"prompt": "   "}, "params.prompt"),
        ({"prompt": "fox", "colour": "red"}, "params.colour"),
        ({"prompt": "fox", "step_seconds": -1}, "params.step_seconds"),
        ({"prompt": "fox", "seed": True}, "params.seed"),
    ],
)
def test_params_the_generator_refuses_are_a_400_naming_the_path_and_hold_nothing(
    tenant_with_credits, params, field
):
    response = submit(tenant_with_credits, params)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid", field)
    assert error["message"].startswith(f"{field}: ")
    assert not Hold.objects.exists() and not Job.objects.exists()


def test_params_the_generator_accepts_are_admitted(tenant_with_credits):
    response = submit(tenant_with_credits, {"prompt": "fox", "seed": 7.0, "steps": 3})
    assert response.status_code == 202, response.content


def test_the_schema_is_served_to_any_key_and_not_to_strangers(tenant_with_credits, anonymous):
    response = tenant_with_credits.get("/v1/generator/schema")
    assert response.status_code == 200
    schema = response.json()
    assert schema["required"] == ["prompt"] and schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"prompt", "seed", "steps", "step_seconds"}
    assert anonymous.get("/v1/generator/schema").status_code == 401


def test_without_a_schema_params_go_unchecked_and_the_schema_is_404(tenant_with_credits, settings):
    settings.GANTRY_GENERATOR_PARAMS_SCHEMA = ""
    assert submit(tenant_with_credits, {"prompt": "fox", "colour": "red"}).status_code == 202
    response = tenant_with_credits.get("/v1/generator/schema")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_an_unreadable_schema_refuses_submissions_with_503_not_unchecked(
    tenant_with_credits, settings, tmp_path
):
    broken = tmp_path / "schema.json"
    broken.write_text("{not json")
    settings.GANTRY_GENERATOR_PARAMS_SCHEMA = str(broken)
    response = submit(tenant_with_credits, {"prompt": "fox"})
    assert response.status_code == 503, response.content
    assert not Hold.objects.exists()


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
)
params_like = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.one_of(st.text(max_size=8), scalars),
        "seed": st.one_of(st.integers(min_value=-5, max_value=2**63 + 5), scalars),
        "steps": st.one_of(st.integers(min_value=-2, max_value=10_002), scalars),
        "step_seconds": st.one_of(st.floats(min_value=-1, max_value=3601), scalars),
    },
)


@settings(max_examples=400, deadline=None)
@given(params=params_like)
def test_the_schema_accepts_exactly_what_the_stand_in_accepts(tmp_path_factory, params):
    path = tmp_path_factory.mktemp("p") / "params.json"
    path.write_text(json.dumps(params))
    try:
        load_params(str(path))
        generator_accepts = True
    except BadParams:
        generator_accepts = False
    try:
        check_params(params)
        schema_accepts = True
    except GantryError:
        schema_accepts = False
    assert schema_accepts == generator_accepts, params
