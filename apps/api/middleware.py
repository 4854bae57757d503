"""Request ids: taken from X-Request-Id or minted, echoed back, and put on every log line."""

import uuid

from apps.api.logging import request_id_var

HEADER = "HTTP_X_REQUEST_ID"


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        incoming = request.META.get(HEADER, "")
        request_id = incoming[:64] if incoming.isascii() and incoming.strip() else uuid.uuid4().hex
        token = request_id_var.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            request_id_var.reset(token)
        response["X-Request-Id"] = request_id
        return response
