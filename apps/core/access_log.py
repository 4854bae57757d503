"""One access line per HTTP request, written by the API's ASGI application.

The line keeps the shape gunicorn's access log had (and that operators grep), with the
request id the API answered with, as the `gantry.access` logger: the JSON formatter
adds time, level and pid:

    127.0.0.1 "POST /v1/jobs HTTP/1.1" 202 812 14ms request_id=4f0c… agent="gantry/1.0"

A stream's line is written when it closes, so its time is how long it was followed.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("gantry.access")


class AccessLog:
    """ASGI middleware: logs each HTTP request once its response has been sent."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        seen = {"status": 0, "bytes": 0, "request_id": "-"}

        async def observed_send(message):
            kind = message["type"]
            if kind == "http.response.start":
                seen["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == b"x-request-id":
                        seen["request_id"] = value.decode("latin-1")
            elif kind == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            if logger.isEnabledFor(logging.INFO):
                logger.info(_line(scope, seen, time.perf_counter() - started))


def _line(scope, seen: dict, elapsed_s: float) -> str:
    client = (scope.get("client") or ("-",))[0]
    path = scope.get("raw_path") or scope.get("path", "").encode()
    query = scope.get("query_string") or b""
    target = (path + (b"?" + query if query else b"")).decode("latin-1")
    agent = "-"
    for name, value in scope.get("headers", ()):
        if name == b"user-agent":
            agent = value.decode("latin-1")
            break
    return (
        f'{client} "{scope.get("method", "-")} {target} HTTP/{scope.get("http_version", "1.1")}" '
        f"{seen['status']} {seen['bytes']} {round(elapsed_s * 1000)}ms "
        f'request_id={seen["request_id"]} agent="{agent}"'
    )
