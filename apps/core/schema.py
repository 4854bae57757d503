"""The OpenAPI schema at /v1/schema/ (drf-spectacular), made to say what the API answers.

- Errors: every error answer has one shape (apps.core.errors), the `ErrorResponse`
  component. GantryAutoSchema attaches to each operation the statuses it can answer,
  derived from the operation as documented (docs/api.md, "Errors"):

  | status | on |
  |---|---|
  | 400 | an operation with a body, query parameters or header parameters |
  | 401 | an operation that needs a key (its `security` names no anonymous access) |
  | 404 | an operation with path parameters |
  | 409 | an operation that takes an `Idempotency-Key` (a key reused with another body) |
  | 413 | an operation with a body (larger than DATA_UPLOAD_MAX_MEMORY_SIZE) |
  | 414 | every operation (a URL longer than apps.core.middleware.MAX_URL_LENGTH) |
  | 415 | an operation with a body (one that is not application/json) |
  | 503 | every operation (PostgreSQL or Redis unreachable; with Retry-After) |

  a 403 where a permission refuses some authenticated keys (REFUSING_PERMISSIONS), and
  whatever a view method declares with `@also_answers(...)`: 402, 403, a 404 or 409
  its services raise, 422, 429.
- Auth: `Authorization: Bearer <key>` is the `BearerAuth` security scheme
  (APIKeyScheme, for apps.accounts.authentication.APIKeyAuthentication, named by path:
  apps.core imports no other app).
- Lists: the paginators (apps.core.pagination) describe `{"results", "next"}`.
- Plain Django views (the async job streams) are not DRF views, which drf-spectacular
  cannot see: a view declares its operation with `@plain_operation(...)` and the
  `add_plain_views` postprocessing hook puts it in the schema.
"""

from __future__ import annotations

import copy
from http import HTTPStatus

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiViewExtension
from drf_spectacular.generators import EndpointEnumerator
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_serializer,
    extend_schema_view,
)
from rest_framework import serializers

SECURITY_SCHEME = "BearerAuth"
ERROR_COMPONENT = "ErrorResponse"
IDEMPOTENCY_HEADER = "Idempotency-Key"

ERROR_CODES_HELP = (
    "Stable, machine-readable: invalid, malformed, unauthenticated, forbidden, "
    "budget_exceeded, insufficient_credits, not_found, conflict, idempotency_mismatch, "
    "too_large, uri_too_long, rate_limited, overloaded, quota_exceeded, unavailable, ..."
)


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text=ERROR_CODES_HELP)
    message = serializers.CharField(help_text="For people; may change.")
    field = serializers.CharField(
        allow_null=True,
        help_text="The offending field, header or parameter (`params.steps`, "
        "`Idempotency-Key`), or null.",
    )


@extend_schema_serializer(component_name=ERROR_COMPONENT)
class ErrorResponseSerializer(serializers.Serializer):
    """Every error answer, whatever its status."""

    error = ErrorDetailSerializer()


# What each status means, and an example answer (docs/api.md, "Errors").
ERRORS: dict[int, tuple[str, dict]] = {
    400: (
        "Invalid body, query or header; `field` names it.",
        {
            "code": "invalid",
            "message": "params.steps: 0 is less than the minimum of 1",
            "field": "params.steps",
        },
    ),
    401: (
        "Missing, unknown or revoked API key.",
        {"code": "unauthenticated", "message": "Invalid or revoked API key.", "field": None},
    ),
    402: (
        "Not enough credits for the job's hold.",
        {
            "code": "insufficient_credits",
            "message": "Not enough credits: 2400000 needed, 1000000 available.",
            "field": None,
        },
    ),
    403: (
        "Not allowed with this key: an operator-only endpoint, an org-only one, or a hard "
        "budget that would be exceeded.",
        {"code": "forbidden", "message": "This endpoint needs an operator key.", "field": None},
    ),
    404: (
        "No such object, or another tenant's (existence is not leaked).",
        {"code": "not_found", "message": "Not found.", "field": None},
    ),
    409: (
        "An Idempotency-Key reused with another body, or a change the object's state refuses.",
        {
            "code": "idempotency_mismatch",
            "message": "This Idempotency-Key was used with a different request body.",
            "field": "Idempotency-Key",
        },
    ),
    410: (
        "The link has expired.",
        {"code": "link_expired", "message": "This link has expired.", "field": None},
    ),
    413: (
        "The body is larger than the limit (2.5 MB).",
        {"code": "too_large", "message": "The body is larger than 2621440 bytes.", "field": None},
    ),
    414: (
        "The URL is longer than 8,192 characters.",
        {
            "code": "uri_too_long",
            "message": "The URL is longer than 8192 characters.",
            "field": None,
        },
    ),
    415: (
        "The body is not JSON (`Content-Type: application/json`).",
        {
            "code": "unsupported_media_type",
            "message": 'Unsupported media type "text/plain" in request.',
            "field": None,
        },
    ),
    422: (
        "The same job spec failed too often and is quarantined.",
        {"code": "quarantined", "message": "This job spec is quarantined.", "field": None},
    ),
    429: (
        "Rate limited, the free tier shed under overload, or the org's queue is full; "
        "Retry-After says when to retry.",
        {"code": "rate_limited", "message": "Too many submissions; retry in 1 s.", "field": None},
    ),
    503: (
        "PostgreSQL or Redis cannot be reached, or the API process is receiving too many "
        "large bodies (over 64 KiB) at once; Retry-After says when to retry.",
        {
            "code": "unavailable",
            "message": "The service is temporarily unavailable; retry shortly.",
            "field": None,
        },
    ),
}
RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    }
}

# Printable ASCII, at most 255 characters once its surrounding blanks are stripped
# (apps.core.idempotency); a blank key is no key.
IDEMPOTENCY_KEY_SCHEMA = {
    "type": "string",
    "maxLength": 255,
    "pattern": r"^[\x20-\x7e]*$",
    "example": "3f1c2d9e-submit-1",
}
REQUIRED_IDEMPOTENCY_KEY_SCHEMA = {
    **IDEMPOTENCY_KEY_SCHEMA,
    "minLength": 1,
    "pattern": r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$",
}


def idempotency_parameter(*, required: bool = False, description: str = "") -> OpenApiParameter:
    """The Idempotency-Key header: the same key and body replay the first answer; the
    same key with another body is a 409 (documented with it)."""
    text = description or (
        "The same key and body replay the first answer (`Idempotent-Replayed: true`); "
        "the same key with another body is a 409. Scoped to the caller's org (and project)."
    )
    rules = " Printable ASCII, at most 255 characters; surrounding blanks are ignored"
    return OpenApiParameter(
        IDEMPOTENCY_HEADER,
        REQUIRED_IDEMPOTENCY_KEY_SCHEMA if required else IDEMPOTENCY_KEY_SCHEMA,
        OpenApiParameter.HEADER,
        required=required,
        description=("Required. " if required else "Optional. ")
        + text
        + rules
        + ("." if required else " (a blank key is none)."),
    )


ALSO_ANSWERS = "openapi_also_answers"


def also_answers(*statuses: int):
    """Declare error statuses a view method answers beyond those its shape implies
    (see the module docstring): put it outermost, above @extend_schema and @idempotent."""
    unknown = set(statuses) - set(ERRORS)
    if unknown:
        raise ValueError(f"No description for status(es) {sorted(unknown)} in ERRORS.")

    def decorate(method):
        setattr(method, ALSO_ANSWERS, frozenset(statuses) | getattr(method, ALSO_ANSWERS, set()))
        return method

    return decorate


def error_statuses(operation: dict, declared=()) -> set[int]:
    """The error statuses `operation` (an OpenAPI operation object) can answer."""
    statuses = {414, 503, *declared}
    parameters = operation.get("parameters", [])
    locations = {parameter["in"] for parameter in parameters}
    if "requestBody" in operation:
        statuses |= {400, 413, 415}
    if locations & {"query", "header"}:
        statuses.add(400)
    if "path" in locations:
        statuses.add(404)
    if any(p["in"] == "header" and p["name"] == IDEMPOTENCY_HEADER for p in parameters):
        statuses.add(409)
    security = operation.get("security")
    if security and {} not in security:
        statuses.add(401)
    return statuses


REPLAYED = {
    "Idempotent-Replayed": {
        "description": "`true` when this answer replays the first one given to this "
        "Idempotency-Key (and body).",
        "required": False,
        "schema": {"type": "string", "enum": ["true"]},
    }
}


def add_error_responses(operation: dict, error_ref: dict, declared=()) -> None:
    """Document each error status of `operation` that it does not document already, and
    the replay header of an operation that takes an Idempotency-Key."""
    responses = operation.setdefault("responses", {})
    parameters = operation.get("parameters", [])
    if any(p["in"] == "header" and p["name"] == IDEMPOTENCY_HEADER for p in parameters):
        for status, response in responses.items():
            if status.startswith("2"):
                response.setdefault("headers", {}).update(copy.deepcopy(REPLAYED))
    for status in sorted(error_statuses(operation, declared)):
        if str(status) in responses:
            continue
        description, example = ERRORS[status]
        response = {
            "description": description,
            "content": {
                "application/json": {
                    "schema": error_ref,
                    "examples": {
                        HTTPStatus(status).phrase.replace(" ", "").replace("-", ""): {
                            "value": {"error": example}
                        }
                    },
                }
            },
        }
        if status in (429, 503):
            response["headers"] = copy.deepcopy(RETRY_AFTER)
        responses[str(status)] = response
    operation["responses"] = dict(sorted(responses.items()))


# Permission classes that refuse an authenticated key with a 403: for every method, or
# for the methods that change something. Named by path: apps.core imports no other app.
REFUSING_PERMISSIONS = {
    "apps.accounts.permissions.IsOperator": "all",
    "apps.accounts.permissions.IsOperatorForWrites": "writes",
}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# A serializer class attribute: True where a body field it does not declare is a 400
# (the schema says `additionalProperties: false`); DRF itself ignores them.
REFUSES_UNKNOWN_FIELDS = "refuses_unknown_fields"
# A serializer class attribute: constraints across fields (anyOf, oneOf, ...) added to its
# request body's schema; such a body is required.
REQUEST_SCHEMA = "openapi_request_schema"


def _refuses(view, method: str) -> bool:
    for permission in getattr(view, "permission_classes", ()):
        refuses = REFUSING_PERMISSIONS.get(f"{permission.__module__}.{permission.__qualname__}")
        if refuses == "all" or (refuses == "writes" and method.upper() not in SAFE_METHODS):
            return True
    return False


class GantryAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, adding the error answers each operation can give."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        handler = getattr(self.view, method.lower(), None)
        declared = set(getattr(handler, ALSO_ANSWERS, ()))
        if _refuses(self.view, method):
            declared.add(403)
        for parameter in operation.get("parameters", []):
            if parameter["in"] == "query":
                # DRF reads an empty query value as the parameter left out.
                parameter["allowEmptyValue"] = True
        error_ref = self.resolve_serializer(ErrorResponseSerializer, "response").ref
        add_error_responses(operation, error_ref, declared)
        return operation

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request":
            _not_blank(serializer, schema)
            if getattr(serializer, REFUSES_UNKNOWN_FIELDS, False):
                schema["additionalProperties"] = False
            schema.update(copy.deepcopy(getattr(serializer, REQUEST_SCHEMA, {})))
        return schema

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        if body is not None and getattr(self.get_request_serializer(), REQUEST_SCHEMA, None):
            body["required"] = True  # the constraints need a body
        return body


# The characters Python calls blank (str.isspace, str.strip, `\s` of `re`), as a regex
# character class body: ECMA's `\s` (JSON Schema's) differs, without U+001C to U+001F and
# U+0085 and with U+FEFF.
PYTHON_BLANKS = r"\t-\r\x1c- \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# A character that is not blank to str.strip() (DRF trims with it).
NOT_BLANK = f"[^{PYTHON_BLANKS}]"


def python_pattern_as_ecma(pattern: str) -> str:
    r"""A regex that a server evaluates with Python's `re`, for a schema (ECMA-262): `\s`
    and `\S` outside a character class become Python's blanks, spelled out."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            escape = pattern[i : i + 2]
            if not in_class and escape in ("\\s", "\\S"):
                out.append(f"[{PYTHON_BLANKS}]" if escape == "\\s" else NOT_BLANK)
            else:
                out.append(escape)
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        out.append(char)
        i += 1
    return "".join(out)


def _not_blank(serializer, schema: dict) -> None:
    """A CharField trims blanks and then refuses an empty value: its text needs a
    non-blank character, which `minLength` alone does not say (also for the items of a
    list of them). A list that may not be empty has at least one item."""
    properties = schema.get("properties", {})
    for name, field in serializer.fields.items():
        prop = properties.get(name)
        if prop is None:
            continue
        _not_blank_text(field, prop)
        if isinstance(field, serializers.ListField) and prop.get("type") == "array":
            _not_blank_text(field.child, prop.get("items", {}))
            if not field.allow_empty:
                prop.setdefault("minItems", 1)


def _not_blank_text(field, prop: dict) -> None:
    if (
        isinstance(field, serializers.CharField)
        and field.trim_whitespace
        and not field.allow_blank
        and prop.get("type") == "string"
        and not {"pattern", "enum", "format"} & set(prop)
    ):
        prop["pattern"] = NOT_BLANK


class APIKeyScheme(OpenApiAuthenticationExtension):
    target_class = "apps.accounts.authentication.APIKeyAuthentication"
    name = SECURITY_SCHEME

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "API key",
            "description": "`Authorization: Bearer <key>`. A key belongs to an org (and "
            "optionally a project and a user), or is an operator key. "
            "`python manage.py create_operator_key` prints the first operator key.",
        }


class AuditTrailSchema(OpenApiViewExtension):
    """GET /v1/audit, documented from here (apps/audit is left as it is): typed filters
    and an example of a page. The view itself is unchanged."""

    target_class = "apps.audit.views.AuditTrailView"

    def view_replacement(self):
        documented = extend_schema(
            operation_id="audit_list",
            summary="The audit trail (operator)",
            parameters=[
                OpenApiParameter(
                    "org",
                    OpenApiTypes.UUID,
                    description="Only this org's rows; an org that does not exist is a 400.",
                ),
                OpenApiParameter(
                    "job",
                    OpenApiTypes.UUID,
                    description="Only rows about this job; a job that does not exist is a 400.",
                ),
                OpenApiParameter(
                    "since", OpenApiTypes.DATETIME, description="ISO 8601, inclusive."
                ),
                OpenApiParameter(
                    "until",
                    OpenApiTypes.DATETIME,
                    description="ISO 8601, exclusive; later than `since`.",
                ),
                OpenApiParameter(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": 200},
                    description="1 to 200 (default 50).",
                ),
            ],
            examples=[
                OpenApiExample(
                    "A preemption",
                    response_only=True,
                    value={
                        "results": [
                            {
                                "id": "dispatch:1042",
                                "at": "2026-01-15T09:30:00Z",
                                "source": "dispatch",
                                "kind": "dispatch.preempt",
                                "org": "0b6f1d1e-6c55-4d5e-9f1a-3c2b7f9e8a10",
                                "job": "4e8b2c6d-0a1f-4d3e-8b7c-9a5f1e2d6c87",
                                "actor": "scheduler",
                                "summary": "preempted on h100-1 for a higher-priority job",
                                "reason": "enterprise job 9d2c… outranks it",
                                "data": {"node": "h100-1", "gpus": [0]},
                            }
                        ],
                        "next": "MjAyNi0wMS0xNVQwOToyOTo1OVp8MnwxMDQx",
                    },
                )
            ],
        )
        return extend_schema_view(get=documented)(type("AuditTrailView", (self.target,), {}))


# Plain (non-DRF) Django views: their operations, added by the postprocessing hook.

PLAIN_OPERATIONS = "openapi_plain_operations"


def plain_operation(method: str, operation: dict, *, also: tuple[int, ...] = ()):
    """Declare the OpenAPI `operation` that a plain Django view answers for `method`.

    Write it as a finished operation object (parameters, responses with their media
    types and examples); the error answers are added as for DRF views (`also`: extra
    statuses). The view itself is returned unchanged (an async view stays async)."""

    def decorate(view):
        operations = dict(getattr(view, PLAIN_OPERATIONS, {}))
        operations[method.lower()] = (operation, tuple(also))
        setattr(view, PLAIN_OPERATIONS, operations)
        return view

    return decorate


class _PlainViewEnumerator(EndpointEnumerator):
    def should_include_endpoint(self, path, callback):
        return hasattr(callback, PLAIN_OPERATIONS)

    def get_allowed_methods(self, callback):
        return [method.upper() for method in getattr(callback, PLAIN_OPERATIONS)]


def add_plain_views(result, generator, request, public):
    """drf-spectacular postprocessing hook: the operations `@plain_operation` declares."""
    error_ref = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    enumerator = _PlainViewEnumerator(generator.patterns, generator.urlconf)
    for path, _regex, method, callback in enumerator.get_api_endpoints():
        declared, also = getattr(callback, PLAIN_OPERATIONS)[method.lower()]
        operation = copy.deepcopy(declared)
        operation.setdefault("security", [{SECURITY_SCHEME: []}])
        add_error_responses(operation, error_ref, also)
        result["paths"].setdefault(path, {})[method.lower()] = operation
    result["paths"] = dict(sorted(result["paths"].items()))
    return result


def example(name: str, value, *, request: bool = False, response: bool = False, **options):
    """An OpenApiExample for a serializer: request_only / response_only by flag."""
    return OpenApiExample(
        name, value=value, request_only=request, response_only=response, **options
    )


__all__ = [
    "ERRORS",
    "IDEMPOTENCY_HEADER",
    "NOT_BLANK",
    "PYTHON_BLANKS",
    "REFUSES_UNKNOWN_FIELDS",
    "REQUEST_SCHEMA",
    "SECURITY_SCHEME",
    "APIKeyScheme",
    "ErrorResponseSerializer",
    "GantryAutoSchema",
    "add_plain_views",
    "also_answers",
    "example",
    "idempotency_parameter",
    "plain_operation",
    "python_pattern_as_ecma",
]
