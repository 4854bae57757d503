"""Request ids, and the guard that refuses what must not reach a view.

Request ids: taken from X-Request-Id or minted, echoed back, and put on every log line.

The id also travels with the tasks the request publishes and with a submitted job (see
apps/core/logging.py), so it ends up in log lines of other processes, in access logs and
in headers: only a plain token is taken from the client (letters, digits and . _ : - @,
at most 64 characters); anything else is replaced by a minted id.
"""

import logging
import re
import uuid

import django.db
import psycopg
import redis.exceptions
from django.conf import settings
from django.http import JsonResponse

from apps.core.errors import problem
from apps.core.logging import request_id_var

logger = logging.getLogger(__name__)

HEADER = "HTTP_X_REQUEST_ID"
ACCEPTED = re.compile(r"[A-Za-z0-9._:@-]{1,64}")


def request_id_of(request) -> str:
    """The client's request id if it is a plain token, else a new one."""
    incoming = request.META.get(HEADER, "")
    return incoming if ACCEPTED.fullmatch(incoming) else uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request_id = request_id_of(request)
        token = request_id_var.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-Id"] = request_id
        return response


# Longest path + query string the API answers; longer is 414 (the server in front lets it
# through so that the answer is JSON, see config/gunicorn.py).
MAX_URL_LENGTH = 8192
# Seconds a client is asked to wait when PostgreSQL or Redis cannot be reached.
UNAVAILABLE_RETRY_AFTER_S = 5
UNAVAILABLE = (
    django.db.OperationalError,
    django.db.InterfaceError,
    # The hot paths send statements on psycopg directly (apps.core.sql, the ledger's
    # pipelines), past Django's error wrapper: a lost server arrives as psycopg's own.
    psycopg.OperationalError,
    psycopg.InterfaceError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


def _problem_response(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse(problem(code, message, status_code=status), status=status)


class RequestGuardMiddleware:
    """Refuses, as JSON, requests that must not reach a view, and answers 503 when a
    backing service is down.

    - a declared body larger than DATA_UPLOAD_MAX_MEMORY_SIZE: 413, before it is read;
    - a path and query longer than MAX_URL_LENGTH: 414;
    - a NUL or an undecodable byte in the path or the query (PostgreSQL refuses NUL in
      text, so it would otherwise fail deep in a lookup): 400;
    - PostgreSQL or Redis unreachable while serving: 503 with Retry-After, never 500.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        return self.get_response(request)

    def _refusal(self, request) -> JsonResponse | None:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return _problem_response("malformed", "Content-Length is not a number.", 400)
        if limit is not None and declared > limit:
            return _problem_response("too_large", f"The body is larger than {limit} bytes.", 413)
        query = request.META.get("QUERY_STRING", "")
        if len(request.path) + len(query) > MAX_URL_LENGTH:
            return _problem_response(
                "uri_too_long", f"The URL is longer than {MAX_URL_LENGTH} characters.", 414
            )
        try:
            values = [v for values in request.GET.lists() for v in (values[0], *values[1])]
        except UnicodeDecodeError:
            return _problem_response("malformed", "The query string is not UTF-8.", 400)
        if "\x00" in request.path or any("\x00" in v or not _encodable(v) for v in values):
            return _problem_response(
                "malformed", "The URL contains a NUL or an invalid character.", 400
            )
        return None

    def process_exception(self, request, exception):
        if not isinstance(exception, UNAVAILABLE):
            return None
        if isinstance(exception, psycopg.Error):
            # Django did not see it fail: have the request's end check each connection
            # and replace a dead one, as it does after its own errors.
            for db in django.db.connections.all(initialized_only=True):
                db.errors_occurred = True
        logger.warning(
            "backing service unavailable",
            extra={"path": request.path, "error": type(exception).__name__},
        )
        response = _problem_response(
            "unavailable",
            "The service is temporarily unavailable; retry shortly.",
            503,
        )
        response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER_S)
        return response


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
