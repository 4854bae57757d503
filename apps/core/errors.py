"""One error shape for the whole API: {"error": {"code", "message", "field"}}."""

from __future__ import annotations

import logging

from django.contrib import admin
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.http import JsonResponse
from django.template.response import TemplateResponse
from rest_framework import exceptions, status

logger = logging.getLogger(__name__)


class GantryError(exceptions.APIException):
    """A domain error with a stable code, raised by services and shaped by the handler."""

    status_code = status.HTTP_400_BAD_REQUEST
    code = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        status_code: int | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(detail=message)
        self.message = message
        if code:
            self.code = code
        if status_code:
            self.status_code = status_code
        self.field = field
        self.retry_after = retry_after


class InsufficientCredits(GantryError):
    status_code = status.HTTP_402_PAYMENT_REQUIRED
    code = "insufficient_credits"


class BudgetExceeded(GantryError):
    status_code = status.HTTP_403_FORBIDDEN
    code = "budget_exceeded"


class Conflict(GantryError):
    status_code = status.HTTP_409_CONFLICT
    code = "conflict"


class RateLimited(GantryError):
    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    code = "rate_limited"


def problem(code: str, message: str, *, status_code: int, field: str | None = None) -> dict:
    return {"error": {"code": code, "message": message, "field": field}}


def not_found(request, exception=None):
    """The API's JSON shape everywhere but the admin, whose operators read an admin page
    (with its navigation back) rather than a JSON body in their browser."""
    if request.path.startswith("/admin/"):
        response = TemplateResponse(
            request, "admin/404.html", admin.site.each_context(request), status=404
        )
        return response.render()
    return JsonResponse(problem("not_found", "No such endpoint.", status_code=404), status=404)


def json_bad_request(request, exception=None):
    """Django's own refusals (a foreign Host, a body over the size limit, too many
    fields) in the API's shape instead of an HTML page."""
    if isinstance(exception, RequestDataTooBig):
        return JsonResponse(
            problem("too_large", "The body is too large.", status_code=413), status=413
        )
    if isinstance(exception, DisallowedHost):
        message = "The Host header names a host this server does not serve."
    else:
        message = "The request was refused as malformed."
    return JsonResponse(problem("bad_request", message, status_code=400), status=400)


def json_server_error(request):
    logger.error("unhandled error", extra={"path": request.path})
    return JsonResponse(
        problem("internal", "Internal error; it has been logged.", status_code=500), status=500
    )
