"""A WSGI application served from an ASGI server with one hand-off per request.

The API's requests are small: a JSON body of a few KiB in, a JSON body out. a2wsgi, made
for any WSGI application, streams both ways: the worker thread asks the event loop for
each piece of the body and hands it each piece of the response (the start, every chunk,
the end), each a `run_coroutine_threadsafe` it waits on, about ten thread wake-ups a
request (docs/performance.md, "Where a submission's CPU goes"). Here the event loop reads
the whole body first (it is bounded: DATA_UPLOAD_MAX_MEMORY_SIZE), one task runs the
application in the pool, and the response comes back with its result. A response larger
than `stream_above` bytes (a result file served from local storage) is streamed from the
thread in pieces of about that size (not in a file response's 4 KiB blocks).

A body declared larger than the limit is not read: the application answers it (our
middleware's 413) from the headers alone. A body sent without a length (chunked) is read
up to the limit; one that goes beyond it reaches the application with an empty input
and a length over the limit, so it gets the same 413. Large bodies (beyond 64 KiB) count
against a budget per process (`max_buffered`, 64 MiB); one that finds no room is answered
503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import sys
from concurrent.futures import ThreadPoolExecutor

from a2wsgi.wsgi import build_environ

from apps.core.errors import problem

_UNCOUNTED = 64 << 10  # what a body holds without counting against `max_buffered`
_NO_ROOM = object()


class BufferedWSGI:
    """ASGI application (HTTP only) that runs `app` in a pool of `threads` threads."""

    def __init__(
        self,
        app,
        *,
        threads: int,
        max_body: int | None,
        stream_above: int = 1 << 20,
        max_buffered: int = 64 << 20,
    ):
        """`max_body`: the most bytes of a body read before the application sees it
        (None: no limit, as Django's DATA_UPLOAD_MAX_MEMORY_SIZE = None);
        `max_buffered`: the most bytes of large bodies (beyond the first 64 KiB of each)
        this process holds at once. A thousand slow clients each sending 2 MiB would
        otherwise hold 2 GiB; beyond it a large body is refused with a 503 and
        Retry-After (waiting for room could deadlock two bodies that each hold half of
        it), while small ones, every API call's, go on."""
        self.app = app
        self.max_body = sys.maxsize if max_body is None else max_body
        self.stream_above = stream_above
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="WSGI")
        self.max_buffered = max_buffered
        self.buffered = 0  # bytes counted against max_buffered now (the event loop's own)

    async def __call__(self, scope, receive, send) -> None:
        counted = [0]  # what this request's body counts against max_buffered
        try:
            body, declared = await self._read_body(scope, receive, counted)
            if body is _NO_ROOM:
                await _send_no_room(send)
                return
            if body is None:
                return  # the client went away before its request was whole
            environ = build_environ(scope, io.BytesIO(body))
            environ["wsgi.errors"] = sys.stderr
            if declared is not None:
                environ["CONTENT_LENGTH"] = str(declared)
            loop = asyncio.get_running_loop()
            context = contextvars.copy_context()
            answer = await loop.run_in_executor(
                self.executor, context.run, self._respond, environ, send, loop
            )
        finally:
            self.buffered -= counted[0]
        if answer is None:
            return  # streamed from the thread
        start, content = answer
        await send(start)
        await send({"type": "http.response.body", "body": content})

    async def _read_body(self, scope, receive, counted: list[int]):
        """(the body, a length to declare instead of the client's); (None, None) when the
        client disconnected; (_NO_ROOM, None) when a large body finds no room. Nothing is
        read of a body declared over the limit."""
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            return b"", None
        if declared is not None and not self._count(counted, declared - _UNCOUNTED):
            return _NO_ROOM, None
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return b"", size  # sent without a length and over the limit: a 413
            if declared is None and not self._count(counted, size - _UNCOUNTED):
                return _NO_ROOM, None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks), (size if declared is None and size else None)

    def _count(self, counted: list[int], wanted: int) -> bool:
        """Count up to `wanted` bytes of this body against max_buffered; False if there
        is no room for them."""
        more = wanted - counted[0]
        if more <= 0:
            return True
        if self.buffered + more > self.max_buffered:
            return False
        self.buffered += more
        counted[0] += more
        return True

    def _respond(self, environ, send, loop):
        """In a pool thread: run the application. Returns (start message, body), or None
        once a response too large to buffer has been streamed from here."""
        started: list = []  # the start message, once start_response is called
        streaming = False  # whether the start has been sent (from this thread)

        def start_response(status, headers, exc_info=None):
            if exc_info is not None and streaming:
                raise exc_info[1].with_traceback(exc_info[2])  # too late to change it
            code = int(status.split(" ", 1)[0])
            started[:] = [
                {
                    "type": "http.response.start",
                    "status": code,
                    "headers": [
                        (name.strip().encode("latin1").lower(), value.strip().encode("latin1"))
                        for name, value in headers
                    ],
                }
            ]
            return chunks.append  # WSGI's legacy write()

        def send_now(message) -> None:
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        chunks: list[bytes] = []
        iterable = self.app(environ, start_response)
        try:
            size = sum(len(chunk) for chunk in chunks)
            for chunk in iterable:
                chunks.append(chunk)
                size += len(chunk)
                if size > self.stream_above:  # sent in pieces of about this size
                    if not streaming:
                        streaming = True
                        send_now(started[0])
                    body = b"".join(chunks)
                    send_now({"type": "http.response.body", "body": body, "more_body": True})
                    chunks.clear()
                    size = 0
            if streaming:
                send_now({"type": "http.response.body", "body": b"".join(chunks)})
                return None
            return started[0], b"".join(chunks)
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_no_room(send) -> None:
    """503 `unavailable` in the API's error shape, as when PostgreSQL or Redis is out of
    reach: retrying shortly is right for both."""
    body = json.dumps(
        problem(
            "unavailable",
            "Too many large request bodies are being received now; retry shortly.",
            status_code=503,
        )
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
