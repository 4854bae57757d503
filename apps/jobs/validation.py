"""Validation of the POST /v1/jobs body, without a DRF serializer per request.

JobSubmitSerializer (apps/jobs/serializers.py) declares the body for the OpenAPI schema
and is the reference of what is accepted; `validate_submit_body` accepts and refuses
exactly the same bodies, returns the same validated data and reports the same first
error (field path and message) as the serializer does through the exception handler.
Why not the serializer itself: instantiating one deep-copies its declared fields (and
the nested resources serializer's) on every request, which was about a tenth of a
submission's CPU. tests/jobs/test_submit_validation.py checks the two agree, on
hand-picked bodies and on generated ones.

The checks mirror DRF's field classes (CharField, IntegerField, BooleanField,
DictField, ListField, nested Serializer): the order of the fields and, within a field,
of its checks decides which error is reported first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rest_framework.fields import BooleanField, ChoiceField, IntegerField, ListField

from apps.core.errors import GantryError
from apps.jobs.models import DEFAULT_WEBHOOK_EVENTS, WebhookEvent

# Limits shared with the serializer declarations (the schema).
MAX_GPU_COUNT = 8
MAX_GPU_TYPES = 32
MAX_GPU_TYPE_LENGTH = 32
MAX_GPU_MEMORY_GB = 1_000_000
MAX_PROJECT_LENGTH = 200
MAX_WEBHOOK_URL_LENGTH = 2000
# A start deadline longer than this is no deadline a client means (and a queued job's
# hold expires long before it: GANTRY_HOLD_QUEUE_ALLOWANCE_S).
MAX_START_DEADLINE_S = 30 * 24 * 3600
# In the order a job lives them: the validated list is put in this order.
WEBHOOK_EVENTS = tuple(event.value for event in WebhookEvent)

SUBMIT_FIELDS = frozenset(
    (
        "project",
        "params",
        "resources",
        "max_runtime_s",
        "preemptible",
        "webhook_url",
        "webhook_events",
        "start_deadline_s",
    )
)
RESOURCE_FIELDS = frozenset(("gpu_count", "gpu_types", "min_gpu_memory_gb"))

REQUIRED = "This field is required."
NOT_NULL = "This field may not be null."
UNKNOWN = "Unknown field."
NOT_A_LIST = str(ListField.default_error_messages["not_a_list"])
EMPTY_LIST = str(ListField.default_error_messages["empty"])
INVALID_CHOICE = str(ChoiceField.default_error_messages["invalid_choice"])
DUPLICATE_EVENT = '"{value}" is listed twice; list each event once.'
EVENTS_WITHOUT_URL = "Needs a webhook_url to be sent to."

_DECIMAL_TAIL = IntegerField.re_decimal  # "1.0" is an integer, "1.2" is not
_SURROGATE = re.compile("[\ud800-\udfff]")
_MISSING = object()


class _Invalid(Exception):
    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path = path  # keys from the body down to the offending value
        self.message = message


def field_name(path: tuple) -> str | None:
    """The dotted field name the exception handler gives a serializer error at `path`
    (apps.core.exception_handler._first_validation_error): "non_field_errors" names its
    parent, and an empty name is no field at all."""
    name = ""
    for key in path:
        if key == "non_field_errors":
            continue
        name = f"{name}.{key}" if name else str(key)
    return name or None


def validate_submit_body(data) -> dict:
    """The validated submission (what JobSubmitSerializer.validated_data would be).

    Keys: params, max_runtime_s, preemptible always; project, resources (gpu_count,
    min_gpu_memory_gb, gpu_types if given), webhook_url, webhook_events (distinct, in
    WEBHOOK_EVENTS order) and start_deadline_s (None for null: no deadline) when given.
    webhook_events other than the default ["completed"] need a non-blank webhook_url
    (checked last, as the serializer's validate() does). Raises a 400
    GantryError (code `invalid`) naming the first offending field, in the serializer's
    words: "<field>: <message>".
    """
    try:
        return _submit_body(data)
    except _Invalid as error:
        field = field_name(error.path)
        text = f"{field}: {error.message}" if field else error.message
        raise GantryError(text, code="invalid", field=field) from None


def _submit_body(data) -> dict:
    if data is None:
        raise _Invalid((), "No data provided")
    if not isinstance(data, dict):
        raise _Invalid((), "Expected a JSON object.")
    _refuse_unknown(data, SUBMIT_FIELDS, ())
    body = {}
    project = data.get("project", _MISSING)
    if project is not _MISSING:
        body["project"] = _string(project, ("project",), max_length=MAX_PROJECT_LENGTH)
    body["params"] = _params(data.get("params", _MISSING))
    resources = data.get("resources", _MISSING)
    if resources is not _MISSING:
        body["resources"] = _resources(resources)
    body["max_runtime_s"] = _integer(data.get("max_runtime_s", _MISSING), ("max_runtime_s",), 1)
    preemptible = data.get("preemptible", _MISSING)
    body["preemptible"] = True if preemptible is _MISSING else _boolean(preemptible)
    webhook_url = data.get("webhook_url", _MISSING)
    if webhook_url is not _MISSING:
        body["webhook_url"] = _string(
            webhook_url, ("webhook_url",), max_length=MAX_WEBHOOK_URL_LENGTH, allow_blank=True
        )
    events = data.get("webhook_events", _MISSING)
    if events is not _MISSING:
        body["webhook_events"] = _webhook_events(events)
    deadline = data.get("start_deadline_s", _MISSING)
    if deadline is not _MISSING:
        # null is accepted and means no deadline, like leaving the field out.
        body["start_deadline_s"] = (
            None
            if deadline is None
            else _integer(deadline, ("start_deadline_s",), 1, MAX_START_DEADLINE_S)
        )
    _refuse_events_without_url(body)
    return body


def _webhook_events(value) -> list[str]:
    # Every refusal names the list itself, not an item: there are three names to choose from.
    field = ("webhook_events",)
    if value is None:
        raise _Invalid(field, NOT_NULL)
    if isinstance(value, str | Mapping) or not hasattr(value, "__iter__"):
        raise _Invalid(field, NOT_A_LIST.format(input_type=type(value).__name__))
    if len(value) == 0:
        raise _Invalid(field, EMPTY_LIST)
    events = []
    for item in value:
        if item is None:
            raise _Invalid(field, NOT_NULL)
        if str(item) not in WEBHOOK_EVENTS:
            raise _Invalid(field, INVALID_CHOICE.format(input=item))
        events.append(str(item))
    for index, event in enumerate(events):
        if event in events[:index]:
            raise _Invalid(field, DUPLICATE_EVENT.format(value=event))
    return [event for event in WEBHOOK_EVENTS if event in events]


def _refuse_events_without_url(body: dict) -> None:
    """Events other than the default mean the client expects deliveries: without a URL
    there would be none, silently."""
    events = body.get("webhook_events")
    if (
        events is not None
        and tuple(events) != DEFAULT_WEBHOOK_EVENTS
        and not body.get("webhook_url")
    ):
        raise _Invalid(("webhook_events",), EVENTS_WITHOUT_URL)


def _refuse_unknown(data: dict, known: frozenset, path: tuple) -> None:
    unknown = set(data) - known
    if unknown:
        raise _Invalid((*path, min(unknown)), UNKNOWN)


def _params(value) -> dict:
    path = ("params",)
    if value is _MISSING:
        raise _Invalid(path, REQUIRED)
    if value is None:
        raise _Invalid(path, NOT_NULL)
    if not isinstance(value, dict):
        raise _Invalid(
            path, f'Expected a dictionary of items but got type "{type(value).__name__}".'
        )
    return {str(key): item for key, item in value.items()}


def _resources(value) -> dict:
    path = ("resources",)
    if value is None:
        raise _Invalid(path, NOT_NULL)
    if not isinstance(value, Mapping):
        raise _Invalid(
            (*path, "non_field_errors"),
            f"Invalid data. Expected a dictionary, but got {type(value).__name__}.",
        )
    _refuse_unknown(value, RESOURCE_FIELDS, path)
    resources = {}
    count = value.get("gpu_count", _MISSING)
    resources["gpu_count"] = (
        1 if count is _MISSING else _integer(count, ("resources", "gpu_count"), 1, MAX_GPU_COUNT)
    )
    types = value.get("gpu_types", _MISSING)
    if types is not _MISSING:
        resources["gpu_types"] = _gpu_types(types)
    memory = value.get("min_gpu_memory_gb", _MISSING)
    resources["min_gpu_memory_gb"] = (
        0
        if memory is _MISSING
        else _integer(memory, ("resources", "min_gpu_memory_gb"), 0, MAX_GPU_MEMORY_GB)
    )
    return resources


def _gpu_types(value) -> list[str]:
    field = ("resources", "gpu_types")
    if value is None:
        raise _Invalid(field, NOT_NULL)
    if isinstance(value, str | Mapping) or not hasattr(value, "__iter__"):
        raise _Invalid(field, f'Expected a list of items but got type "{type(value).__name__}".')
    names = [
        _string(item, (*field, index), max_length=MAX_GPU_TYPE_LENGTH)
        for index, item in enumerate(value)
    ]
    if len(names) > MAX_GPU_TYPES:
        raise _Invalid(field, f"Ensure this field has no more than {MAX_GPU_TYPES} elements.")
    return names


def _integer(value, field: tuple, min_value: int | None = None, max_value: int | None = None):
    if value is _MISSING:
        raise _Invalid(field, REQUIRED)
    if value is None:
        raise _Invalid(field, NOT_NULL)
    if isinstance(value, str) and len(value) > IntegerField.MAX_STRING_LENGTH:
        raise _Invalid(field, "String value too large.")
    try:
        number = int(_DECIMAL_TAIL.sub("", str(value)))
    except (ValueError, TypeError):
        raise _Invalid(field, "A valid integer is required.") from None
    if max_value is not None and number > max_value:
        raise _Invalid(field, f"Ensure this value is less than or equal to {max_value}.")
    if min_value is not None and number < min_value:
        raise _Invalid(field, f"Ensure this value is greater than or equal to {min_value}.")
    return number


def _string(value, field: tuple, *, max_length: int, allow_blank: bool = False) -> str:
    if value == "" or str(value).strip() == "":
        if not allow_blank:
            raise _Invalid(field, "This field may not be blank.")
        return ""
    if value is None:
        raise _Invalid(field, NOT_NULL)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _Invalid(field, "Not a valid string.")
    text = str(value).strip()
    if len(text) > max_length:
        raise _Invalid(field, f"Ensure this field has no more than {max_length} characters.")
    if "\x00" in text:
        raise _Invalid(field, "Null characters are not allowed.")
    surrogate = _SURROGATE.search(text)
    if surrogate:
        raise _Invalid(
            field, f"Surrogate characters are not allowed: U+{ord(surrogate.group()):X}."
        )
    return text


def _boolean(value) -> bool:
    if value is None:
        raise _Invalid(("preemptible",), NOT_NULL)
    key = value.lower() if isinstance(value, str) else value
    try:
        if key in BooleanField.TRUE_VALUES:
            return True
        if key in BooleanField.FALSE_VALUES:
            return False
    except TypeError:  # unhashable (a list or an object)
        pass
    raise _Invalid(("preemptible",), "Must be a valid boolean.")
