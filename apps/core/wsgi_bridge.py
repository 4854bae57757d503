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
and a length over the limit, so it gets the same 413.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import sys
from concurrent.futures import ThreadPoolExecutor

from a2wsgi.wsgi import build_environ


class BufferedWSGI:
    """ASGI application (HTTP only) that runs `app` in a pool of `threads` threads."""

    def __init__(self, app, *, threads: int, max_body: int | None, stream_above: int = 1 << 20):
        """`max_body`: the most bytes of a body read before the application sees it
        (None: no limit, as Django's DATA_UPLOAD_MAX_MEMORY_SIZE = None)."""
        self.app = app
        self.max_body = sys.maxsize if max_body is None else max_body
        self.stream_above = stream_above
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="WSGI")

    async def __call__(self, scope, receive, send) -> None:
        body, declared = await self._read_body(scope, receive)
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
        if answer is None:
            return  # streamed from the thread
        start, content = answer
        await send(start)
        await send({"type": "http.response.body", "body": content})

    async def _read_body(self, scope, receive) -> tuple[bytes | None, int | None]:
        """(the body, a length to declare instead of the client's), or (None, None) when
        the client disconnected. Nothing is read of a body declared over the limit."""
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            return b"", None
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return b"", size  # sent without a length and over the limit: a 413
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks), (size if declared is None and size else None)

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
