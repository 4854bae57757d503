"""Running the `gantry` client in-process, and a tiny real HTTP server for transport tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gantry_client.cli import main


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@pytest.fixture(autouse=True)
def isolated_client_config(tmp_path, monkeypatch):
    """No test reads the developer's ~/.config/gantry or their GANTRY_* variables."""
    monkeypatch.setenv("GANTRY_CONFIG", str(tmp_path / "gantry-config.toml"))
    monkeypatch.delenv("GANTRY_API_URL", raising=False)
    monkeypatch.delenv("GANTRY_API_KEY", raising=False)
    return tmp_path / "gantry-config.toml"


@pytest.fixture
def gantry(capsys) -> Callable[..., Run]:
    """gantry(*argv) runs the command line in this process and returns code, stdout, stderr."""

    def run(*argv: str) -> Run:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Run(code=code, out=captured.out, err=captured.err)

    return run


@dataclass
class Seen:
    method: str
    path: str
    headers: dict
    body: bytes


@dataclass
class StubServer:
    """Answers each (method, path) with a function of the request: (status, headers, body).

    A body that is not bytes is an iterable of chunks, written and flushed one by one
    (a Server-Sent Events stream); the connection closes after the last."""

    url: str = ""
    routes: dict = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def on(self, method: str, path: str, answer: Callable[[Seen], tuple[int, dict, bytes]]):
        self.routes[(method, path)] = answer


def _handler(stub: StubServer):
    class Handler(BaseHTTPRequestHandler):
        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            seen = Seen(self.command, self.path, dict(self.headers), self.rfile.read(length))
            stub.seen.append(seen)
            answer = stub.routes.get((self.command, self.path.split("?")[0]))
            status, headers, body = (
                answer(seen) if answer else (404, {"Content-Type": "text/plain"}, b"no route")
            )
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if isinstance(body, bytes):
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                # A stream: each chunk as it is produced, then the connection closes
                # (HTTP/1.0), whether the chunks ended an event or cut one short.
                self.end_headers()
                for chunk in body:
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return  # the client gave up first (the timeout test): nothing to answer

        do_GET = do_POST = _serve

        def log_message(self, *args):  # keep test output clean
            return

    return Handler


@pytest.fixture
def stub_server():
    stub = StubServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield stub
    server.shutdown()
    server.server_close()
    thread.join()


def json_answer(status: int, data, **headers) -> Callable[[Seen], tuple[int, dict, bytes]]:
    body = json.dumps(data).encode()
    return lambda _seen: (status, {"Content-Type": "application/json", **headers}, body)


def in_turn(*answers: Callable[[Seen], tuple]) -> Callable[[Seen], tuple]:
    """The first answer to the first request, the next to the next; the last one after."""
    queue = list(answers)

    def answer(seen: Seen):
        return (queue.pop(0) if len(queue) > 1 else queue[0])(seen)

    return answer


def sse_answer(*chunks: str | bytes) -> Callable[[Seen], tuple[int, dict, object]]:
    """An event stream of these chunks (str as UTF-8), the connection closed after them."""
    raw = [c.encode() if isinstance(c, str) else c for c in chunks]
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    return lambda _seen: (200, headers, iter(raw))


def job_event(body: dict) -> str:
    return f"event: job\ndata: {json.dumps(body)}\n\n"
