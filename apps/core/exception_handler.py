"""DRF exception handler answering every error in the problem shape of apps.core.errors."""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler

from apps.core.errors import GantryError, problem


def _first_validation_error(detail, path: str = "") -> tuple[str | None, str]:
    """Walk DRF's nested error detail to the first leaf: (dotted field path, message)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            sub = f"{path}.{key}" if path else str(key)
            if key == "non_field_errors":
                sub = path or None
            return _first_validation_error(value, sub or "")
    if isinstance(detail, list) and detail:
        first = detail[0]
        if isinstance(first, (dict, list)):
            index = f"{path}[0]" if path else ""
            return _first_validation_error(first, index)
        return (path or None), str(first)
    return (path or None), str(detail)


def problem_exception_handler(exc, context):
    """DRF exception handler that answers every error in the problem shape."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    if isinstance(exc, GantryError):
        response = Response(
            problem(exc.code, exc.message, status_code=exc.status_code, field=exc.field),
            status=exc.status_code,
        )
        if exc.retry_after is not None:
            response["Retry-After"] = str(exc.retry_after)
        return response

    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_validation_error(exc.detail)
        text = f"{field}: {message}" if field else message
        response.data = problem("invalid", text, status_code=400, field=field)
    elif isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        response.data = problem("unauthenticated", str(exc.detail), status_code=401)
    elif isinstance(exc, exceptions.PermissionDenied):
        response.data = problem("forbidden", str(exc.detail), status_code=403)
    elif isinstance(exc, exceptions.NotFound):
        response.data = problem("not_found", str(exc.detail), status_code=404)
    elif isinstance(exc, exceptions.Throttled):
        response.data = problem("rate_limited", str(exc.detail), status_code=429)
    elif isinstance(exc, exceptions.ParseError):
        response.data = problem("malformed", str(exc.detail), status_code=400)
    else:
        code = getattr(exc, "default_code", "error")
        response.data = problem(
            code, str(getattr(exc, "detail", exc)), status_code=response.status_code
        )
    return response
