"""validate_submit_body agrees with JobSubmitSerializer, the schema's reference.

Both verdicts go through the API's exception handler, so what is compared is what a
client would get: the 400 body (code, message naming the field, field) or the
validated data, types included (True is not 1).
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework.exceptions import ValidationError

from apps.core.errors import GantryError
from apps.core.exception_handler import problem_exception_handler
from apps.jobs.serializers import JobSubmitSerializer
from apps.jobs.validation import RESOURCE_FIELDS, SUBMIT_FIELDS, validate_submit_body
from tests.jobs.factories import spec_body


def serializer_verdict(body):
    serializer = JobSubmitSerializer(data=body)
    if serializer.is_valid():
        return "ok", json.dumps(serializer.validated_data, sort_keys=True)
    response = problem_exception_handler(ValidationError(serializer.errors), {})
    return response.status_code, response.data


def validator_verdict(body):
    try:
        data = validate_submit_body(body)
    except GantryError as error:
        response = problem_exception_handler(error, {})
        return response.status_code, response.data
    return "ok", json.dumps(data, sort_keys=True)


def body_with(**changes):
    body = spec_body(project="video")
    for name, value in changes.items():
        if value is DROP:
            body.pop(name, None)
        else:
            body[name] = value
    return body


DROP = object()
HOOK = "https://client.example/hook"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (body_with(priority="high"), "priority"),
        (body_with(priority="high", colour="red"), "colour"),  # the first unknown, sorted
        (body_with(resources={"gpu_count": 1, "colour": "red"}), "resources.colour"),
        (body_with(resources={"gpu_count": 0}), "resources.gpu_count"),
        (body_with(resources={"gpu_count": 9}), "resources.gpu_count"),
        (body_with(resources={"gpu_count": "two"}), "resources.gpu_count"),
        (body_with(resources={"gpu_count": True}), "resources.gpu_count"),
        (body_with(resources={"gpu_count": 1.5}), "resources.gpu_count"),
        (body_with(resources={"gpu_count": None}), "resources.gpu_count"),
        (body_with(resources={"min_gpu_memory_gb": -1}), "resources.min_gpu_memory_gb"),
        (body_with(resources={"min_gpu_memory_gb": 10**7}), "resources.min_gpu_memory_gb"),
        (body_with(resources={"gpu_types": "H100"}), "resources.gpu_types"),
        (body_with(resources={"gpu_types": {"H100": 1}}), "resources.gpu_types"),
        (body_with(resources={"gpu_types": ["H100", ""]}), "resources.gpu_types.1"),
        (body_with(resources={"gpu_types": ["H100", None]}), "resources.gpu_types.1"),
        (body_with(resources={"gpu_types": [True]}), "resources.gpu_types.0"),
        (body_with(resources={"gpu_types": ["X" * 33]}), "resources.gpu_types.0"),
        (body_with(resources={"gpu_types": ["H100"] * 33}), "resources.gpu_types"),
        (body_with(resources="big"), "resources"),
        (body_with(resources=None), "resources"),
        (body_with(resources=[1]), "resources"),
        (body_with(max_runtime_s=DROP), "max_runtime_s"),
        (body_with(max_runtime_s=None), "max_runtime_s"),
        (body_with(max_runtime_s="soon"), "max_runtime_s"),
        (body_with(max_runtime_s=0), "max_runtime_s"),
        (body_with(max_runtime_s="9" * 1001), "max_runtime_s"),
        (body_with(max_runtime_s=[600]), "max_runtime_s"),
        (body_with(params=DROP), "params"),
        (body_with(params=None), "params"),
        (body_with(params="a red fox"), "params"),
        (body_with(params=["a red fox"]), "params"),
        (body_with(preemptible="maybe"), "preemptible"),
        (body_with(preemptible=None), "preemptible"),
        (body_with(preemptible=[True]), "preemptible"),
        (body_with(preemptible=2), "preemptible"),
        (body_with(project=""), "project"),
        (body_with(project="   "), "project"),
        (body_with(project=None), "project"),
        (body_with(project=["video"]), "project"),
        (body_with(project=True), "project"),
        (body_with(project="p" * 201), "project"),
        (body_with(project="vi\x00deo"), "project"),
        (body_with(project="vi\ud800deo"), "project"),
        (body_with(webhook_url=None), "webhook_url"),
        (body_with(webhook_url={"url": "x"}), "webhook_url"),
        (body_with(webhook_url="https://h/" + "x" * 2000), "webhook_url"),
        (body_with(webhook_url=HOOK, webhook_events=None), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events="start"), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events={"start": True}), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events=[]), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events=["started"]), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events=["start", "Progress"]), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events=["start", None]), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events=[["start"]]), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events=[""]), "webhook_events"),
        (body_with(webhook_url=HOOK, webhook_events=[1]), "webhook_events"),
        # Duplicates are refused, not collapsed: the client may have meant another event.
        (body_with(webhook_url=HOOK, webhook_events=["start", "start"]), "webhook_events"),
        (
            body_with(webhook_url=HOOK, webhook_events=["completed", "start", "completed"]),
            "webhook_events",
        ),
        # Events beyond the default mean deliveries are expected: not without a URL.
        (body_with(webhook_events=["start", "completed"]), "webhook_events"),
        (body_with(webhook_url="  ", webhook_events=["progress"]), "webhook_events"),
        (body_with(start_deadline_s=0), "start_deadline_s"),
        (body_with(start_deadline_s=-1), "start_deadline_s"),
        (body_with(start_deadline_s="soon"), "start_deadline_s"),
        (body_with(start_deadline_s=True), "start_deadline_s"),
        (body_with(start_deadline_s=1.5), "start_deadline_s"),
        (body_with(start_deadline_s=30 * 24 * 3600 + 1), "start_deadline_s"),
        # Several errors at once: the first field in declaration order is named.
        (body_with(params=1, max_runtime_s="x", preemptible="x"), "params"),
        (body_with(resources={"gpu_count": 0}, max_runtime_s="x"), "resources.gpu_count"),
        (body_with(webhook_events=["x"], start_deadline_s=0), "webhook_events"),
        # The missing URL is checked once every field is valid (the serializer's validate).
        (body_with(webhook_events=["start"], start_deadline_s=0), "start_deadline_s"),
        (
            body_with(resources={"gpu_count": 0, "gpu_types": [""], "min_gpu_memory_gb": -1}),
            "resources.gpu_count",
        ),
    ],
)
def test_each_refusal_is_a_400_naming_the_field_like_the_serializer(body, field):
    status, data = validator_verdict(body)
    assert status == 400
    assert data["error"]["code"] == "invalid"
    assert data["error"]["field"] == field
    assert data["error"]["message"].startswith(f"{field}: ")
    assert (status, data) == serializer_verdict(body)


@pytest.mark.parametrize("body", [None, [], ["x"], "a body", 42])
def test_a_body_that_is_no_object_names_no_field(body):
    status, data = validator_verdict(body)
    assert status == 400
    assert data["error"]["field"] is None
    assert (status, data) == serializer_verdict(body)


@pytest.mark.parametrize(
    "body",
    [
        spec_body(project="video"),
        spec_body(),
        {"params": {}, "max_runtime_s": 600},
        body_with(resources={}),
        body_with(resources={"gpu_types": []}),
        body_with(resources={"gpu_types": [" H100 ", 7, 1.5]}),
        body_with(resources={"gpu_count": "2", "min_gpu_memory_gb": "40.0"}),
        body_with(max_runtime_s=" 600 ", preemptible="No"),
        body_with(max_runtime_s=600.0, preemptible=0),
        body_with(preemptible="TRUE"),
        body_with(project=" video ", webhook_url="   "),
        body_with(project=12, webhook_url=""),
        body_with(webhook_url=HOOK, webhook_events=["start", "progress", "completed"]),
        body_with(webhook_url=HOOK, webhook_events=["completed", "progress"]),
        body_with(webhook_url=HOOK, webhook_events=["start"]),
        body_with(webhook_url=HOOK, webhook_events=("completed",)),
        body_with(webhook_events=["completed"]),  # the default needs no URL
        body_with(start_deadline_s=300),
        body_with(start_deadline_s=None),
        body_with(start_deadline_s="300"),
        body_with(params={"nested": {"a": [1, None, "x"]}, "n": None}),
    ],
)
def test_accepted_bodies_validate_to_the_serializers_data(body):
    verdict = validator_verdict(body)
    assert verdict[0] == "ok", verdict
    assert verdict == serializer_verdict(body)


def test_webhook_events_are_put_in_the_order_a_job_lives_them():
    body = body_with(webhook_url=HOOK, webhook_events=["completed", "start", "progress"])
    assert validate_submit_body(body)["webhook_events"] == ["start", "progress", "completed"]
    assert validator_verdict(body) == serializer_verdict(body)


def test_webhook_event_refusals_say_what_is_wrong():
    messages = {
        "started": '"started" is not a valid choice.',
        "dup": '"start" is listed twice; list each event once.',
        "no url": "Needs a webhook_url to be sent to.",
    }
    for case, events, url in [
        ("started", ["started"], HOOK),
        ("dup", ["start", "start"], HOOK),
        ("no url", ["start"], None),
    ]:
        body = body_with(webhook_events=events, **({"webhook_url": url} if url else {}))
        status, data = validator_verdict(body)
        assert (status, data["error"]["message"]) == (400, f"webhook_events: {messages[case]}")


def test_defaults_are_filled_in():
    data = validate_submit_body({"params": {"a": 1}, "max_runtime_s": 60, "resources": {}})
    assert data == {
        "params": {"a": 1},
        "max_runtime_s": 60,
        "preemptible": True,
        "resources": {"gpu_count": 1, "min_gpu_memory_gb": 0},
    }


# --- generated bodies -------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "0",
            "1",
            "8",
            "9",
            "1.0",
            "1.5",
            " 7 ",
            "yes",
            "No",
            "off",
            "t",
            "null",
            "H100",
            "A100",
            "x\x00",
            "\ud83d",
            "600",
            "1e3",
            "-1",
            "٣",
        ]
    ),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)
gpu_type_lists = st.lists(
    st.one_of(st.sampled_from(["H100", "A100", " H100", ""]), scalars), max_size=35
)
webhook_event_lists = st.lists(
    st.one_of(st.sampled_from(["start", "progress", "completed", "Start", ""]), scalars),
    max_size=4,
)
resources = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "gpu_count": st.one_of(st.integers(-1, 10), json_values),
            "gpu_types": st.one_of(gpu_type_lists, json_values),
            "min_gpu_memory_gb": st.one_of(st.integers(-1, 2_000_000), json_values),
            "colour": json_values,
        },
    ),
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "project": st.one_of(st.text(max_size=210), json_values),
            "params": st.one_of(st.dictionaries(st.text(max_size=8), json_values), json_values),
            "resources": resources,
            "max_runtime_s": st.one_of(st.integers(-5, 10**7), json_values),
            "preemptible": json_values,
            "webhook_url": st.one_of(st.text(max_size=30), json_values),
            "webhook_events": st.one_of(webhook_event_lists, json_values),
            "start_deadline_s": st.one_of(st.integers(-5, 3_000_000), json_values),
            "priority": json_values,
            "a": json_values,
        },
    ),
)


@settings(max_examples=1500, deadline=None)
@given(bodies)
def test_generated_bodies_get_the_serializers_verdict(body):
    assert validator_verdict(body) == serializer_verdict(body)


@pytest.mark.django_db
def test_the_schema_still_documents_the_submission_body(client):
    schema = client.get("/v1/schema/?format=json").json()
    body = schema["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    submit_schema = schema["components"]["schemas"][body["schema"]["$ref"].split("/")[-1]]
    assert set(submit_schema["properties"]) == {
        "project",
        "params",
        "resources",
        "max_runtime_s",
        "preemptible",
        "webhook_url",
        "webhook_events",
        "start_deadline_s",
    }
    assert set(submit_schema["required"]) == {"params", "max_runtime_s"}


def test_the_validator_knows_the_serializers_fields():
    serializer = JobSubmitSerializer()
    assert set(serializer.fields) == SUBMIT_FIELDS
    assert set(serializer.fields["resources"].fields) == RESOURCE_FIELDS
