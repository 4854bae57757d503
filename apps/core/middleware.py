"""Request ids: taken from X-Request-Id or minted, echoed back, and put on every log line.

The id also travels with the tasks the request publishes and with a submitted job (see
apps/core/logging.py), so it ends up in log lines of other processes, in access logs and
in headers: only a plain token is taken from the client (letters, digits and . _ : - @,
at most 64 characters); anything else is replaced by a minted id.
"""

import re
import uuid

from apps.core.logging import request_id_var

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
