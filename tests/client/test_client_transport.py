"""What only a misbehaving or absent server shows: refused connections, 5xx, non-JSON,
timeouts, a flaky poll, a result on another origin. A small real HTTP server (not mocks).
The API's own answers are tested against the live server in test_client_live.py.
"""

from __future__ import annotations

import json
import socket
import threading

from tests.client.conftest import json_answer

JOB_ID = "3d0c5a52-5a8f-4d0c-9f44-0c9e9a1f7e11"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_connection_refused_names_the_url_it_tried(gantry):
    url = f"http://127.0.0.1:{closed_port()}"
    run = gantry("--api-url", url, "--api-key", "gk_x", "status", JOB_ID)
    assert run.code == 4
    assert f"Cannot reach the Gantry API at {url}" in run.err
    assert "connection refused" in run.err
    assert f"Tried {url}/v1/jobs/{JOB_ID}" in run.err
    assert "the URL came from --api-url" in run.err
    assert "GANTRY_API_URL" in run.err


def test_server_error_quotes_the_request_id_the_server_logged(gantry, stub_server):
    def crash(seen):
        body = {"error": {"code": "internal", "message": "Internal error; it has been logged."}}
        headers = {"Content-Type": "application/json", "X-Request-Id": seen.headers["X-Request-Id"]}
        return 500, headers, json.dumps(body).encode()

    stub_server.on("GET", "/v1/balance", crash)
    run = gantry("--api-url", stub_server.url, "--api-key", "gk_x", "balance")
    assert run.code == 4
    request_id = stub_server.seen[0].headers["X-Request-Id"]
    assert "The server failed (HTTP 500 internal): Internal error; it has been logged." in run.err
    assert f"Request id {request_id}" in run.err


def test_proxy_error_page_is_shown_not_parsed(gantry, stub_server):
    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
    stub_server.on("GET", "/v1/balance", lambda _s: (502, {"Content-Type": "text/html"}, page))
    run = gantry("--api-url", stub_server.url, "--api-key", "gk_x", "--json", "balance")
    assert run.code == 4
    assert "HTTP 502 http_502" in run.err
    assert "502 Bad Gateway" in run.err
    assert run.out == ""


def test_success_status_with_a_body_that_is_not_json(gantry, stub_server):
    stub_server.on(
        "GET",
        f"/v1/jobs/{JOB_ID}",
        lambda _s: (200, {"Content-Type": "application/json"}, b'{"id": "3d0c", "status": '),
    )
    run = gantry("--api-url", stub_server.url, "--api-key", "gk_x", "status", JOB_ID)
    assert run.code == 4
    assert "did not answer like the Gantry API (HTTP 200)" in run.err
    assert "the answer is not JSON" in run.err
    assert f"Is {stub_server.url} the Gantry API?" in run.err


def test_a_server_that_does_not_answer_in_time(gantry, stub_server):
    release = threading.Event()

    def stall(_seen):
        release.wait(10)
        return 200, {"Content-Type": "application/json"}, b"{}"

    stub_server.on("GET", "/v1/balance", stall)
    try:
        run = gantry(
            "--api-url", stub_server.url, "--api-key", "gk_x", "--timeout", "0.3", "balance"
        )
    finally:
        release.set()
    assert run.code == 4
    assert "no answer within 0.3 s" in run.err


def test_wait_rides_out_a_brief_outage_and_keeps_the_key_off_another_origin(
    gantry, stub_server, tmp_path
):
    """A server without the job stream (404) is polled; a 503 and a 500 while polling are
    waited out; the signed result URL on another origin (here the same server named
    `localhost`) is fetched without the API key."""
    snapshots = iter(
        [
            (200, {"id": JOB_ID, "status": "running", "progress": 0.5}, {}),
            (
                503,
                {"error": {"code": "unavailable", "message": "Restarting."}},
                {"Retry-After": "0"},
            ),
            (500, {"error": {"code": "internal", "message": "Oops."}}, {}),
            (
                200,
                {"id": JOB_ID, "status": "succeeded", "progress": 1.0, "hold": {"charged": 7}},
                {},
            ),
        ]
    )

    def poll(_seen):
        status, body, headers = next(snapshots)
        return status, {"Content-Type": "application/json", **headers}, json.dumps(body).encode()

    port = stub_server.url.rsplit(":", 1)[1]
    signed = f"http://localhost:{port}/signed/{JOB_ID}/output.gif?sig=abc&exp=1"
    stub_server.on("GET", f"/v1/jobs/{JOB_ID}", poll)
    stub_server.on("GET", f"/v1/jobs/{JOB_ID}/result", lambda _s: (302, {"Location": signed}, b""))
    stub_server.on(
        "GET",
        f"/signed/{JOB_ID}/output.gif",
        lambda _s: (200, {"Content-Type": "image/gif"}, b"GIF89a-fake-frames"),
    )
    run = gantry(
        "--api-url",
        stub_server.url,
        "--api-key",
        "gk_secret",
        "wait",
        JOB_ID,
        "--poll-max",
        "0.05",
        "-o",
        tmp_path,
    )
    assert run.code == 0, run.err
    saved = tmp_path / "output.gif"  # into a folder: the file's own name
    assert saved.read_bytes() == b"GIF89a-fake-frames"
    assert f"Result saved to {saved}" in run.out
    assert "charged 0.000007 credits" in run.out
    by_path = {seen.path.split("?")[0]: seen for seen in stub_server.seen}
    assert stub_server.seen[0].path == f"/v1/jobs/{JOB_ID}/stream"
    assert by_path[f"/v1/jobs/{JOB_ID}/result"].headers["Authorization"] == "Bearer gk_secret"
    assert "Authorization" not in by_path[f"/signed/{JOB_ID}/output.gif"].headers


def test_wait_on_an_unreachable_server_fails_at_once(gantry):
    url = f"http://127.0.0.1:{closed_port()}"
    run = gantry("--api-url", url, "--api-key", "gk_x", "wait", JOB_ID)
    assert run.code == 4
    assert f"Cannot reach the Gantry API at {url}" in run.err


def test_a_status_the_api_does_not_document_is_shown_with_its_body(gantry, stub_server):
    stub_server.on(
        "GET",
        "/v1/balance",
        json_answer(418, {"error": {"code": "teapot", "message": "I am a teapot.", "field": None}}),
    )
    run = gantry("--api-url", stub_server.url, "--api-key", "gk_x", "--json", "balance")
    assert run.code == 3
    assert "The API refused the request (HTTP 418 teapot): I am a teapot." in run.err
    assert run.json() == {
        "status": 418,
        "error": {"code": "teapot", "message": "I am a teapot.", "field": None},
    }


def test_a_submission_unanswered_by_one_api_host_is_resent_to_the_next_with_the_same_key(
    gantry, stub_server
):
    down = f"http://127.0.0.1:{closed_port()}"
    job = {"id": JOB_ID, "status": "queued", "hold": {"amount": 1_000_000}}
    stub_server.on("POST", "/v1/jobs", json_answer(202, job))
    run = gantry(
        "--api-url", f"{down},{stub_server.url}", "--api-key", "gk_x",
        "submit", "--prompt", "fox", "--idempotency-key", "key-1",
    )  # fmt: skip
    assert run.code == 0, run.err
    assert f"no answer from {down}; resending to {stub_server.url}" in run.err
    assert f"Submitted job {JOB_ID}" in run.out
    [sent] = stub_server.seen
    assert sent.headers["Idempotency-Key"] == "key-1"


def test_when_no_api_host_answers_the_submission_fails_after_trying_each(gantry):
    first, second = (f"http://127.0.0.1:{closed_port()}" for _ in range(2))
    run = gantry(
        "--api-url", f"{first},{second}", "--api-key", "gk_x", "submit", "--prompt", "fox"
    )  # fmt: skip
    assert run.code == 4
    assert f"no answer from {first}; resending to {second}" in run.err
    assert "Cannot reach the Gantry API" in run.err
