"""The API's WSGI bridge: whole bodies in, whole responses out, large ones streamed.

Driven as an ASGI server drives it, with a small WSGI application that echoes what it
was given; the real server path (uvicorn, Django) is covered by the live-stack tests."""

import asyncio
import json

import pytest

from apps.core.wsgi_bridge import BufferedWSGI


def echo(environ, start_response):
    """Answers what it read: the body, its declared length."""
    body = environ["wsgi.input"].read()
    start_response("201 Created", [("Content-Type", "application/json")])
    return [
        json.dumps(
            {"body": body.decode(), "length": environ.get("CONTENT_LENGTH")},
        ).encode()
    ]


def http_scope(headers=()):
    return {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/jobs",
        "query_string": b"",
        "root_path": "",
        "headers": list(headers),
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


def serve(app, scope, chunks, *, disconnect=False):
    """Run one request; returns (messages sent, messages received by the app)."""
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    if disconnect:
        incoming[-1]["more_body"] = True
        incoming.append({"type": "http.disconnect"})
    received, sent = [], []

    async def receive():
        message = incoming.pop(0)
        received.append(message)
        return message

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent, received


def answer(sent) -> tuple[int, dict]:
    start, *bodies = sent
    return start["status"], json.loads(b"".join(m.get("body", b"") for m in bodies))


def test_a_body_sent_in_pieces_reaches_the_application_whole_and_the_answer_comes_in_one():
    bridge = BufferedWSGI(echo, threads=1, max_body=100)
    sent, _ = serve(bridge, http_scope([(b"content-length", b"11")]), [b"hello", b" world"])
    assert answer(sent) == (201, {"body": "hello world", "length": "11"})
    assert len(sent) == 2 and sent[1].get("more_body", False) is False
    assert (b"content-type", b"application/json") in sent[0]["headers"]


def test_a_body_declared_over_the_limit_is_not_read():
    bridge = BufferedWSGI(echo, threads=1, max_body=10)
    sent, received = serve(bridge, http_scope([(b"content-length", b"11")]), [b"hello world"])
    assert received == []
    # The application sees the declared length (our middleware answers 413 from it).
    assert answer(sent) == (201, {"body": "", "length": "11"})


def test_a_body_without_a_length_gets_one_and_over_the_limit_reads_as_too_large():
    bridge = BufferedWSGI(echo, threads=1, max_body=10)
    sent, _ = serve(bridge, http_scope(), [b"hello", b"!"])
    assert answer(sent) == (201, {"body": "hello!", "length": "6"})
    sent, _ = serve(bridge, http_scope(), [b"hello", b" world", b"..."])
    assert answer(sent) == (201, {"body": "", "length": "11"})


def test_a_client_gone_before_its_body_is_whole_runs_nothing():
    called = []

    def app(environ, start_response):  # pragma: no cover - must not run
        called.append(environ)
        return echo(environ, start_response)

    sent, _ = serve(
        BufferedWSGI(app, threads=1, max_body=100), http_scope(), [b"he"], disconnect=True
    )
    assert (sent, called) == ([], [])


def test_a_response_larger_than_the_buffer_is_streamed_and_its_iterable_closed():
    closed = []

    class Chunks:
        def __iter__(self):
            return iter([b"a" * 60, b"b" * 60, b"c" * 60, b"d" * 60, b"e" * 60])

        def close(self):
            closed.append(True)

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "video/mp4")])
        return Chunks()

    bridge = BufferedWSGI(app, threads=1, max_body=100, stream_above=100)
    sent, _ = serve(bridge, http_scope(), [b""])
    start, *bodies = sent
    assert start["status"] == 200
    # In pieces just over the buffer, not chunk by chunk; the last one ends the body.
    assert [len(m["body"]) for m in bodies] == [120, 120, 60]
    assert [m.get("more_body", False) for m in bodies] == [True, True, False]
    assert closed == [True]


def test_an_application_error_reaches_the_server():
    def app(environ, start_response):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        serve(BufferedWSGI(app, threads=1, max_body=100), http_scope(), [b""])


def test_large_bodies_beyond_the_buffer_budget_are_refused_503_and_small_ones_go_on():
    bridge = BufferedWSGI(echo, threads=1, max_body=1 << 20, max_buffered=256 << 10)
    large = b"x" * (200 << 10)
    # Alone, a large body fits the budget, and gives its room back once answered.
    sent, _ = serve(bridge, http_scope([(b"content-length", str(len(large)).encode())]), [large])
    assert answer(sent)[0] == 201
    assert bridge.buffered == 0
    bridge.buffered = 200 << 10  # another large body being received now
    sent, received = serve(
        bridge, http_scope([(b"content-length", str(len(large)).encode())]), [large]
    )
    status, body = answer(sent)
    assert (status, body["error"]["code"], received) == (503, "unavailable", [])
    assert (b"retry-after", b"1") in sent[0]["headers"]
    # Sent without a length, it is refused once it outgrows the room.
    sent, _ = serve(bridge, http_scope(), [large[:100_000], large[100_000:]])
    assert answer(sent)[0] == 503
    # A small body counts for nothing and is served.
    sent, _ = serve(bridge, http_scope([(b"content-length", b"2")]), [b"ok"])
    assert answer(sent) == (201, {"body": "ok", "length": "2"})
    assert bridge.buffered == 200 << 10  # only the other body's room is taken
