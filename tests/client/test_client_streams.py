"""Following jobs and logs live, short ids, project names, result folders and credits,
against a small real HTTP server (tests/client/conftest.py) that plays the API: the
stream framing (keep-alive comments, data over several lines, events cut short), dropped
streams and servers without a stream. The live server's side is in test_client_live.py.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

from tests.client.conftest import in_turn, job_event, json_answer, sse_answer

JOB_ID = "3d0c5a52-5a8f-4d0c-9f44-0c9e9a1f7e11"
ORG_ID = "0f6f1a5e-39c2-4b7e-8a3e-51e1b3b2a001"
PROJECT_ID = "7a4d2c10-1d1e-4f0e-9b55-1a2b3c4d5e6f"
JOB_PATH = f"/v1/jobs/{JOB_ID}"
NOW = datetime.now(UTC)

PLACED_EVENTS = {
    "results": [
        {"at": NOW.isoformat(), "from": None, "to": "queued", "reason": "submitted"},
        {
            "at": NOW.isoformat(),
            "from": "queued",
            "to": "scheduled",
            "reason": "placed on node-7 GPU 0 (H100)",
        },
        {
            "at": NOW.isoformat(),
            "from": "scheduled",
            "to": "running",
            "reason": "attempt 1 started on node-7",
        },
    ]
}


def job(status: str, progress: float = 0.0, *, attempts: int = 1, charged: int = 0, **more):
    body = {
        "id": JOB_ID,
        "status": status,
        "progress": progress,
        "project": PROJECT_ID,
        "attempts": attempts,
        "preemptions": 0,
        "gpu_type": None,  # the node and GPU come from the events
        "queue": None,
        "hold": {"amount": 66_667, "charged": charged, "refunded": 0, "state": "active"},
        "error": None,
        "created_at": None,
        "finished_at": None,
    }
    # Submitted 5 s ago; a finished job ended then, 5 s after its submission.
    created = datetime.now(UTC) - timedelta(seconds=5)
    body["created_at"] = created.isoformat()
    if status in ("succeeded", "failed", "timed_out", "cancelled"):
        body["finished_at"] = (created + timedelta(seconds=5)).isoformat()
    return body | more


def queued_job():
    start = (datetime.now(UTC) + timedelta(seconds=40)).isoformat()
    queue = {
        "position": 2,
        "reason": "waiting for an H100: 1 of 1 busy",
        "estimated_start_at": start,
    }
    return job("queued", attempts=0, queue=queue)


def multi_line_event(body: dict) -> str:
    """One event whose data spans several `data:` lines (joined by newlines: still JSON)."""
    lines = json.dumps(body, indent=1).splitlines()
    return "event: job\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


def serve_result(stub_server, *, disposition: str = 'attachment; filename="output.gif"'):
    signed = f"{stub_server.url}/signed/tok3n"
    stub_server.on("GET", f"{JOB_PATH}/result", lambda _s: (302, {"Location": signed}, b""))
    stub_server.on(
        "GET",
        "/signed/tok3n",
        lambda _s: (
            200,
            {"Content-Type": "image/gif", "Content-Disposition": disposition},
            b"GIF89a-frames",
        ),
    )


def status_lines(run) -> list[str]:
    return [line for line in run.err.splitlines() if line.startswith(f"job {JOB_ID}: ")]


def percents(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.search(r" (\d+)% ", line))]


def paths(stub_server, method: str = "GET") -> list[str]:
    return [s.path.split("?")[0] for s in stub_server.seen if s.method == method]


def cli(stub_server, *argv):
    return ("--api-url", stub_server.url, "--api-key", "gk_x", *argv)


# -- submit --wait / wait: the job's stream -----------------------------------------------


def test_wait_follows_the_stream_showing_every_step_the_server_sends(gantry, stub_server, tmp_path):
    running = [job("running", p / 10, charged=p * 1_000) for p in range(8)]
    done = job("succeeded", 1.0, charged=12_300)
    stub_server.on(
        "GET",
        f"{JOB_PATH}/stream",
        sse_answer(
            job_event(queued_job()),
            ": keep-alive\n\n",
            *[job_event(body) for body in running[:4]],
            "event: jo",  # a line split across two writes
            f"b\ndata: {json.dumps(running[4])}\n\n",
            ": keep-alive\n\n",
            *[multi_line_event(body) for body in running[5:]],
            job_event(done),
        ),
    )
    stub_server.on("GET", f"{JOB_PATH}/events", json_answer(200, PLACED_EVENTS))
    serve_result(stub_server)

    run = gantry(*cli(stub_server, "wait", JOB_ID, "-o", tmp_path / "fox.gif"))
    assert run.code == 0, run.err
    lines = status_lines(run)
    assert re.match(
        rf"job {JOB_ID}: queued \| #2 in queue: waiting for an H100: 1 of 1 busy, "
        r"starts ~in \d+s \| \d+s elapsed \| cost 0\.000000 credits$",
        lines[0],
    ), lines[0]
    assert percents(lines[1:]) == [0, 10, 20, 30, 40, 50, 60, 70, 100]
    assert lines[4].startswith(f"job {JOB_ID}: running 30% | attempt 1 | on node-7 (H100) | ")
    assert lines[4].endswith(" elapsed | cost 0.003000 credits")
    assert lines[-1].startswith(f"job {JOB_ID}: succeeded 100% | attempt 1 | on node-7 (H100)")
    assert lines[-1].endswith("| 5s elapsed | cost 0.012300 credits")
    assert f"Job {JOB_ID} succeeded; charged 0.012300 credits." in run.out
    assert "µc" not in run.err + run.out
    # Followed on its stream alone: the job itself was never polled.
    assert JOB_PATH not in paths(stub_server)
    stream_request = next(s for s in stub_server.seen if s.path.endswith("/stream"))
    assert stream_request.headers["Accept"] == "text/event-stream"
    assert stream_request.headers["Authorization"] == "Bearer gk_x"


def test_a_dropped_stream_is_read_once_and_reconnected(gantry, stub_server, tmp_path):
    """The first connection closes in the middle of an event (never shown half-read);
    the job is read once, then the stream is opened again and followed to the end."""
    stub_server.on(
        "GET",
        f"{JOB_PATH}/stream",
        in_turn(
            sse_answer(job_event(job("running", 0.3)), 'event: job\ndata: {"id": "3d0c'),
            sse_answer(job_event(job("running", 0.6)), job_event(job("succeeded", 1.0))),
        ),
    )
    stub_server.on("GET", JOB_PATH, json_answer(200, job("running", 0.5)))
    stub_server.on("GET", f"{JOB_PATH}/events", json_answer(200, PLACED_EVENTS))
    serve_result(stub_server)

    run = gantry(*cli(stub_server, "wait", JOB_ID, "--poll-max", "0.05", "-o", tmp_path / "f"))
    assert run.code == 0, run.err
    assert percents(status_lines(run)) == [30, 50, 60, 100]
    assert paths(stub_server).count(f"{JOB_PATH}/stream") == 2
    assert paths(stub_server).count(JOB_PATH) == 1


def test_a_stream_that_cannot_be_opened_is_polled_then_opened_again(gantry, stub_server, tmp_path):
    unavailable = json_answer(
        503, {"error": {"code": "unavailable", "message": "Restarting."}}, **{"Retry-After": "0"}
    )
    stub_server.on(
        "GET",
        f"{JOB_PATH}/stream",
        in_turn(unavailable, unavailable, sse_answer(job_event(job("succeeded", 1.0)))),
    )
    stub_server.on(
        "GET", JOB_PATH, in_turn(*(json_answer(200, job("running", p)) for p in (0.2, 0.4)))
    )
    serve_result(stub_server)

    run = gantry(*cli(stub_server, "wait", JOB_ID, "--poll-max", "0.05", "-o", tmp_path / "f"))
    assert run.code == 0, run.err
    assert percents(status_lines(run)) == [20, 40, 100]
    assert paths(stub_server).count(f"{JOB_PATH}/stream") == 3


def test_an_answer_that_is_not_a_stream_means_polling_for_good(gantry, stub_server, tmp_path):
    """A proxy that answers the stream request with JSON: the client polls the job."""
    stub_server.on("GET", f"{JOB_PATH}/stream", json_answer(200, job("running", 0.1)))
    stub_server.on(
        "GET",
        JOB_PATH,
        in_turn(json_answer(200, job("running", 0.5)), json_answer(200, job("succeeded", 1.0))),
    )
    serve_result(stub_server)

    run = gantry(*cli(stub_server, "wait", JOB_ID, "--poll-max", "0.05", "-o", tmp_path / "f"))
    assert run.code == 0, run.err
    assert percents(status_lines(run)) == [50, 100]
    assert paths(stub_server).count(f"{JOB_PATH}/stream") == 1


def test_waiting_on_an_unknown_job_is_a_404_not_a_wait(gantry, stub_server):
    not_found = json_answer(404, {"error": {"code": "not_found", "message": "Not found."}})
    stub_server.on("GET", f"{JOB_PATH}/stream", not_found)
    stub_server.on("GET", JOB_PATH, not_found)
    run = gantry(*cli(stub_server, "wait", JOB_ID))
    assert run.code == 3
    assert f"No job {JOB_ID}: it does not exist, or it belongs to another org." in run.err


def test_the_status_line_says_why_an_attempt_was_retried(gantry, stub_server, tmp_path):
    requeued = {
        "at": NOW.isoformat(),
        "from": "running",
        "to": "queued",
        "reason": "The generator crashed (exit 1): boom Retrying in 0.1 s (failure 1 of 3).",
    }
    second = [
        {"from": "queued", "to": "scheduled", "reason": "placed on node-9 GPU 1 (A100)"},
        {"from": "scheduled", "to": "running", "reason": "attempt 2 started on node-9"},
    ]
    stub_server.on(
        "GET",
        f"{JOB_PATH}/stream",
        sse_answer(
            job_event(job("running", 0.4)),
            job_event(job("queued", 0.4, attempts=1)),
            job_event(job("running", 0.5, attempts=2, gpu_type="A100")),
            job_event(job("succeeded", 1.0, attempts=2, gpu_type="A100")),
        ),
    )
    stub_server.on(
        "GET",
        f"{JOB_PATH}/events",
        in_turn(
            json_answer(200, PLACED_EVENTS),
            json_answer(200, {"results": [*PLACED_EVENTS["results"], requeued]}),
            json_answer(200, {"results": [*PLACED_EVENTS["results"], requeued, *second]}),
        ),
    )
    serve_result(stub_server)

    run = gantry(*cli(stub_server, "wait", JOB_ID, "-o", tmp_path / "f"))
    assert run.code == 0, run.err
    lines = [line.split(" | ")[:3] for line in status_lines(run)]
    assert lines[1][2].endswith(" elapsed")  # where a node would be: none while queued
    assert [line[:3] if "queued" not in line[0] else line[:2] for line in lines] == [
        [f"job {JOB_ID}: running 40%", "attempt 1", "on node-7 (H100)"],
        [f"job {JOB_ID}: queued 40%", "retrying after crash"],
        [f"job {JOB_ID}: running 50%", "attempt 2 after crash", "on node-9 (A100)"],
        [f"job {JOB_ID}: succeeded 100%", "attempt 2 after crash", "on node-9 (A100)"],
    ]


def test_a_job_that_ends_badly_says_so_in_credits(gantry, stub_server):
    failed = job(
        "failed",
        0.2,
        error={"code": "crashed", "message": "Gave up; 4000 µc charged."},
    )
    stub_server.on("GET", f"{JOB_PATH}/stream", sse_answer(job_event(failed)))
    stub_server.on("GET", f"{JOB_PATH}/events", json_answer(200, PLACED_EVENTS))
    run = gantry(*cli(stub_server, "wait", JOB_ID, "--no-progress"))
    assert run.code == 1
    assert f"job {JOB_ID} ended failed: crashed: Gave up; 0.004000 credits charged." in run.err
    assert status_lines(run) == []


# -- logs ---------------------------------------------------------------------------------


def log_lines(*lines: str) -> list[str]:
    return [f"event: line\ndata: {line}\n\n" for line in lines]


def test_logs_print_the_text_of_the_attempt_asked_for(gantry, stub_server):
    stub_server.on("GET", JOB_PATH, json_answer(200, job("succeeded", 1.0, attempts=2)))
    text = b"PROGRESS 0.5\nTraceback (most recent call last):\n  boom\n"
    stub_server.on(
        "GET",
        f"{JOB_PATH}/logs",
        lambda _s: (200, {"Content-Type": "text/plain; charset=utf-8"}, text),
    )
    run = gantry(*cli(stub_server, "logs", JOB_ID, "--attempt", "1"))
    assert run.code == 0, run.err
    assert run.out == text.decode()
    request = next(s for s in stub_server.seen if s.path.startswith(f"{JOB_PATH}/logs"))
    assert parse_qs(urlsplit(request.path).query) == {"attempt": ["1"]}


def test_logs_follow_reconnects_a_dropped_stream_without_repeating_a_line(gantry, stub_server):
    """The server replays an attempt's log from its first line on each connection; the
    first connection here drops mid-event while the attempt still runs."""
    stub_server.on(
        "GET",
        JOB_PATH,
        in_turn(
            json_answer(200, job("running", 0.1)),  # which attempt: the latest, 1
            json_answer(200, job("running", 0.3)),  # the first close was a drop
            json_answer(200, job("succeeded", 1.0)),  # the second was the end
        ),
    )
    stub_server.on(
        "GET",
        f"{JOB_PATH}/logs",
        in_turn(
            sse_answer(*log_lines("step 1", "step 2"), ": keep-alive\n\n", "event: line\ndata: st"),
            sse_answer(*log_lines("step 1", "step 2", "step 3", "  indented: kept as is")),
        ),
    )
    run = gantry(*cli(stub_server, "logs", JOB_ID, "-f", "--poll-max", "0.05"))
    assert run.code == 0, run.err
    assert run.out == "step 1\nstep 2\nstep 3\n  indented: kept as is\n"
    streams = [s for s in stub_server.seen if s.path.startswith(f"{JOB_PATH}/logs")]
    assert len(streams) == 2
    for request in streams:
        assert parse_qs(urlsplit(request.path).query) == {"attempt": ["1"]}
        assert request.headers["Accept"] == "text/event-stream"


def test_logs_follow_says_once_what_the_servers_buffer_lost(gantry, stub_server):
    stub_server.on(
        "GET",
        JOB_PATH,
        in_turn(
            json_answer(200, job("running", 0.1)),
            json_answer(200, job("running", 0.2)),
            json_answer(200, job("queued", 0.2)),  # requeued: attempt 1 is over
        ),
    )
    stub_server.on(
        "GET",
        f"{JOB_PATH}/logs",
        in_turn(
            sse_answer(*log_lines("line 1", "line 2")),
            sse_answer(*log_lines("[... 3 lines skipped ...]", "line 4", "line 5")),
        ),
    )
    run = gantry(*cli(stub_server, "logs", JOB_ID, "-f", "--poll-max", "0.05"))
    assert run.code == 0, run.err
    assert run.out.splitlines() == [
        "line 1",
        "line 2",
        "[... 1 lines skipped ...]",
        "line 4",
        "line 5",
    ]


def test_logs_follow_polls_the_text_where_no_stream_is_offered(gantry, stub_server):
    """A proxy that answers the event-stream request with the plain text: the log is
    read again until the attempt has ended, each line printed once."""

    def text(body: bytes):
        return lambda _s: (200, {"Content-Type": "text/plain; charset=utf-8"}, body)

    stub_server.on(
        "GET",
        JOB_PATH,
        in_turn(
            json_answer(200, job("running", 0.1)),
            json_answer(200, job("running", 0.5)),
            json_answer(200, job("succeeded", 1.0)),
        ),
    )
    stub_server.on(
        "GET",
        f"{JOB_PATH}/logs",
        in_turn(text(b"a\n"), text(b"a\nb\n"), text(b"a\nb\nc\n")),
    )
    run = gantry(*cli(stub_server, "logs", JOB_ID, "-f", "--poll-max", "0.05"))
    assert run.code == 0, run.err
    assert run.out == "a\nb\nc\n"


def test_logs_follow_waits_for_the_first_attempt(gantry, stub_server):
    stub_server.on(
        "GET",
        JOB_PATH,
        in_turn(json_answer(200, queued_job()), json_answer(200, job("succeeded", 1.0))),
    )
    stub_server.on(
        "GET",
        f"{JOB_PATH}/stream",
        sse_answer(job_event(queued_job()), job_event(job("running", 0.0))),
    )
    stub_server.on("GET", f"{JOB_PATH}/logs", sse_answer(*log_lines("hello")))
    run = gantry(*cli(stub_server, "logs", JOB_ID, "--follow"))
    assert run.code == 0, run.err
    assert f"Job {JOB_ID} is queued: waiting for its first attempt to start." in run.err
    assert run.out == "hello\n"


def test_logs_before_any_attempt_and_on_a_server_without_logs(gantry, stub_server):
    stub_server.on("GET", JOB_PATH, json_answer(200, queued_job()))
    not_yet = {"error": {"code": "not_found", "message": "The job has not started an attempt yet."}}
    stub_server.on("GET", f"{JOB_PATH}/logs", json_answer(404, not_yet))
    run = gantry(*cli(stub_server, "logs", JOB_ID))
    assert run.code == 3
    assert f"No log for job {JOB_ID}: The job has not started an attempt yet." in run.err

    no_route = {"error": {"code": "not_found", "message": "No such endpoint."}}
    stub_server.on("GET", f"{JOB_PATH}/logs", json_answer(404, no_route))
    run = gantry(*cli(stub_server, "logs", JOB_ID))
    assert run.code == 3
    assert f"The server at {stub_server.url} has no job logs" in run.err


# -- short ids ----------------------------------------------------------------------------

JOBS = [
    "3f2a0c11-0000-4000-8000-000000000001",
    "3f2b9e22-0000-4000-8000-000000000002",
    "3f2a0c99-0000-4000-8000-000000000003",
    "9c1d7e33-0000-4000-8000-000000000004",
]


def serve_listing(stub_server):
    """Two pages: the first two jobs, then the other two (after a cursor)."""

    def listing(seen):
        query = parse_qs(urlsplit(seen.path).query)
        if query.get("cursor") == ["page2"]:
            page = {"results": [{"id": i, "status": "queued"} for i in JOBS[2:]], "next": None}
        else:
            page = {"results": [{"id": i, "status": "queued"} for i in JOBS[:2]], "next": "page2"}
        return 200, {"Content-Type": "application/json"}, json.dumps(page).encode()

    stub_server.on("GET", "/v1/jobs", listing)
    for job_id in JOBS:
        stub_server.on(
            "GET", f"/v1/jobs/{job_id}", json_answer(200, job("queued") | {"id": job_id})
        )


def test_a_unique_prefix_is_resolved_through_every_page_of_the_listing(gantry, stub_server):
    serve_listing(stub_server)
    run = gantry(*cli(stub_server, "status", "9C1D"))
    assert run.code == 0, run.err
    assert f"Job       {JOBS[3]}" in run.out
    listings = [s for s in stub_server.seen if s.path.split("?")[0] == "/v1/jobs"]
    assert [parse_qs(urlsplit(s.path).query).get("cursor") for s in listings] == [None, ["page2"]]
    assert parse_qs(urlsplit(listings[0].path).query)["limit"] == ["500"]
    assert [p for p in paths(stub_server) if p.startswith("/v1/jobs/")] == [f"/v1/jobs/{JOBS[3]}"]


# Ids as the platform makes them (UUIDv7): one creation minute, random ends.
TIME_ORDERED = [
    "01a250f2-64c8-70a2-8d39-6a1690bb4f52",
    "01a250f2-7ac5-74d0-a4a2-a41aaa183bd8",
    "01a250f2-826a-7163-81fc-cce6b63fce7f",
]


def test_the_last_digits_name_the_job_where_ids_begin_with_their_creation_time(gantry, stub_server):
    page = {"results": [{"id": i, "status": "queued"} for i in TIME_ORDERED], "next": None}
    stub_server.on("GET", "/v1/jobs", json_answer(200, page))
    stub_server.on(
        "GET",
        f"/v1/jobs/{TIME_ORDERED[2]}",
        json_answer(200, job("queued") | {"id": TIME_ORDERED[2]}),
    )
    run = gantry(*cli(stub_server, "status", "B63FCE7F"))
    assert run.code == 0, run.err
    assert f"Job       {TIME_ORDERED[2]}" in run.out

    same_minute = gantry(*cli(stub_server, "status", "01a250f2"))
    assert same_minute.code == 2
    assert "The short job id 01a250f2 is ambiguous: it matches 3 jobs." in same_minute.err


def test_an_ambiguous_prefix_lists_the_candidates(gantry, stub_server):
    serve_listing(stub_server)
    run = gantry(*cli(stub_server, "cancel", "3f2a0c"))
    assert run.code == 2
    assert "The short job id 3f2a0c is ambiguous: it matches 2 jobs." in run.err
    assert JOBS[0] in run.err and JOBS[2] in run.err and JOBS[1] not in run.err
    assert "Give more of the id (its last digits tell jobs apart)." in run.err
    assert paths(stub_server, "POST") == []


def test_a_prefix_that_matches_nothing_and_a_full_id_that_needs_no_listing(gantry, stub_server):
    serve_listing(stub_server)
    run = gantry(*cli(stub_server, "status", "77"))
    assert run.code == 3
    assert "No job 77: no job id that this key can see ends or starts with 77." in run.err

    stub_server.seen.clear()
    run = gantry(*cli(stub_server, "status", JOBS[1]))
    assert run.code == 0, run.err
    assert "/v1/jobs" not in paths(stub_server)
    assert f"/v1/jobs/{JOBS[1]}" in paths(stub_server)


# -- project names ------------------------------------------------------------------------


def serve_projects(stub_server):
    stub_server.on("GET", "/v1/orgs", json_answer(200, {"results": [{"id": ORG_ID}], "next": None}))
    projects = {"results": [{"id": PROJECT_ID, "name": "studio"}], "next": None}
    stub_server.on("GET", f"/v1/orgs/{ORG_ID}/projects", json_answer(200, projects))


def test_jobs_are_shown_with_their_project_names(gantry, stub_server):
    serve_projects(stub_server)
    other = "5b5b5b5b-0000-4000-8000-00000000000f"  # a project the listing does not name
    jobs = [job("queued"), job("running", 0.5) | {"id": JOBS[0], "project": other}]
    stub_server.on("GET", "/v1/jobs", json_answer(200, {"results": jobs, "next": None}))
    stub_server.on("GET", JOB_PATH, json_answer(200, job("queued")))

    shown = gantry(*cli(stub_server, "status", JOB_ID))
    assert shown.code == 0, shown.err
    assert dict(line.split(None, 1) for line in shown.out.splitlines())["Project"] == "studio"

    listed = gantry(*cli(stub_server, "list"))
    assert [line.split()[3] for line in listed.out.splitlines()[1:]] == ["studio", other]
    assert paths(stub_server).count("/v1/orgs") == 2  # once per run

    raw = gantry(*cli(stub_server, "--json", "status", JOB_ID))
    assert raw.json()["project"] == PROJECT_ID


def test_project_ids_are_shown_when_names_cannot_be_read(gantry, stub_server):
    stub_server.on(
        "GET", "/v1/orgs", json_answer(403, {"error": {"code": "forbidden", "message": "No."}})
    )
    stub_server.on("GET", JOB_PATH, json_answer(200, job("queued")))
    run = gantry(*cli(stub_server, "status", JOB_ID))
    assert run.code == 0, run.err
    assert dict(line.split(None, 1) for line in run.out.splitlines())["Project"] == PROJECT_ID


# -- results into a folder ----------------------------------------------------------------


def test_result_into_a_folder_keeps_the_files_own_name(gantry, stub_server, tmp_path, monkeypatch):
    serve_result(stub_server)
    folder = tmp_path / "renders"
    first = gantry(*cli(stub_server, "result", JOB_ID, "-o", f"{folder}/"))
    assert first.code == 0, first.err
    assert (folder / "output.gif").read_bytes() == b"GIF89a-frames"
    assert f"Result saved to {folder / 'output.gif'} (13 bytes)." in first.out

    # The name is taken (outputs are often named alike): the job id keeps both.
    again = gantry(*cli(stub_server, "result", JOB_ID, "-o", folder))
    assert again.code == 0, again.err
    assert (folder / f"output-{JOB_ID}.gif").read_bytes() == b"GIF89a-frames"

    named = gantry(*cli(stub_server, "result", JOB_ID, "-o", tmp_path / "fox.gif"))
    assert named.code == 0, named.err
    assert (tmp_path / "fox.gif").read_bytes() == b"GIF89a-frames"

    monkeypatch.chdir(tmp_path)
    default = gantry(*cli(stub_server, "result", JOB_ID))
    assert default.code == 0, default.err
    assert (tmp_path / f"{JOB_ID}.gif").exists()


def test_a_folder_never_gets_a_path_from_the_server(gantry, stub_server, tmp_path):
    serve_result(stub_server, disposition='attachment; filename="../../etc/passwd.gif"')
    run = gantry(*cli(stub_server, "result", JOB_ID, "-o", f"{tmp_path}/out/"))
    assert run.code == 0, run.err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["passwd.gif"]


# -- credits, not micro-credits ------------------------------------------------------------


def test_refusals_and_reasons_quote_credits(gantry, stub_server):
    refusal = {
        "error": {
            "code": "insufficient_credits",
            "message": "Not enough credit: 5 µc available, 66667 µc requested.",
            "field": "amount",
        }
    }
    stub_server.on("POST", "/v1/jobs", json_answer(402, refusal))
    run = gantry(*cli(stub_server, "submit", "--prompt", "fox"))
    assert run.code == 3
    assert (
        "gantry: Not enough credit: 0.000005 credits available, "
        "0.066667 credits requested.\nSee `gantry balance`" in run.err
    )

    events = {
        "results": [
            {
                "at": NOW.isoformat(),
                "from": "running",
                "to": "succeeded",
                "reason": "settled: 1234 µc charged, 65433 µc refunded",
            }
        ]
    }
    stub_server.on("GET", f"{JOB_PATH}/events", json_answer(200, events))
    shown = gantry(*cli(stub_server, "events", JOB_ID))
    assert "settled: 0.001234 credits charged, 0.065433 credits refunded" in shown.out
    assert "µc" not in run.err + shown.out
    raw = gantry(*cli(stub_server, "--json", "events", JOB_ID))
    assert raw.json()["results"][0]["reason"] == events["results"][0]["reason"]
