"""The client's own logic, no server: amounts, arguments, request bodies, configuration."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gantry_client import config, render
from gantry_client.api import ServerEvent, next_cursor, parse_retry_after, parse_sse
from gantry_client.cli import build_job_request, build_parser, duration_seconds

REPO = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("micro", "shown"),
    [
        (0, "0.000000"),
        (1, "0.000001"),
        (1_234_567, "1.234567"),
        (-5, "-0.000005"),
        (123_456_789_012_345_678, "123456789012.345678"),
        (None, "-"),
    ],
)
def test_amounts_are_credits_with_six_exact_decimals(micro, shown):
    assert render.credits(micro) == shown


@pytest.mark.parametrize(
    ("text", "seconds"), [("600", 600), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("2h", 7200)]
)
def test_max_runtime_accepts_seconds_and_short_durations(text, seconds):
    assert duration_seconds(text) == seconds


def test_submit_body_merges_file_then_param_then_named_flags(tmp_path):
    params_file = tmp_path / "params.json"
    params_file.write_text(json.dumps({"prompt": "from file", "seed": 1, "style": "noir"}))
    args = build_parser().parse_args(
        [
            "submit",
            "--params-file",
            str(params_file),
            "--param",
            "seed=2",
            "--param",
            'tags=["a", "b"]',
            "--param",
            "style=watercolour",
            "--seed",
            "3",
            "--gpus",
            "2",
            "--gpu-type",
            "H100",
            "--gpu-type",
            "A100",
            "--min-gpu-memory-gb",
            "40",
            "--max-runtime",
            "10m",
            "--no-preemptible",
            "--project",
            "studio",
        ]
    )
    assert build_job_request(args) == {
        "params": {"prompt": "from file", "seed": 3, "style": "watercolour", "tags": ["a", "b"]},
        "resources": {"gpu_count": 2, "gpu_types": ["H100", "A100"], "min_gpu_memory_gb": 40},
        "project": "studio",
        "max_runtime_s": 600,
        "preemptible": False,
    }


def test_submit_body_leaves_unset_options_to_the_server():
    args = build_parser().parse_args(["submit", "--prompt", "a red fox in snow"])
    assert build_job_request(args) == {"params": {"prompt": "a red fox in snow"}}


def test_params_file_that_is_not_json_is_a_usage_error_naming_the_file(gantry, tmp_path):
    bad = tmp_path / "params.json"
    bad.write_text("{prompt: fox")
    run = gantry("--api-key", "gk_x", "submit", "--params-file", bad)
    assert run.code == 2
    assert "--params-file" in run.err
    assert str(bad) in run.err


def test_param_without_equals_is_refused_by_the_parser(gantry):
    run = gantry("submit", "--param", "seed7")
    assert run.code == 2
    assert "expected KEY=VALUE" in run.err


def test_missing_key_says_how_to_set_it_and_sends_nothing(gantry):
    # A closed port: had a request been sent, the answer would be "cannot reach" (exit 4).
    run = gantry("--api-url", f"http://127.0.0.1:{closed_port()}", "balance")
    assert run.code == 2
    assert "No API key" in run.err
    assert "GANTRY_API_KEY" in run.err
    assert "gantry configure" in run.err


def test_api_url_without_scheme_is_refused_with_its_source(gantry, monkeypatch):
    monkeypatch.setenv("GANTRY_API_URL", "localhost:8000")
    run = gantry("--api-key", "gk_x", "balance")
    assert run.code == 2
    assert "GANTRY_API_URL" in run.err
    assert "http://host:port" in run.err


def test_settings_precedence_flag_then_environment_then_file(isolated_client_config):
    config.write_file(isolated_client_config, api_url="http://file:1", api_key="gk_file")
    env = {"GANTRY_CONFIG": str(isolated_client_config)}
    from_file = config.resolve(env=env)
    assert (from_file.api_url, from_file.api_key) == ("http://file:1", "gk_file")
    assert from_file.key_source == str(isolated_client_config)

    env |= {"GANTRY_API_URL": "http://env:2/", "GANTRY_API_KEY": "gk_env"}
    from_env = config.resolve(env=env)
    assert (from_env.api_url, from_env.api_key, from_env.key_source) == (
        "http://env:2",
        "gk_env",
        "GANTRY_API_KEY",
    )

    from_flags = config.resolve(api_url="https://flag:3", api_key="gk_flag", env=env)
    assert (from_flags.api_url, from_flags.api_key, from_flags.url_source) == (
        "https://flag:3",
        "gk_flag",
        "--api-url",
    )
    assert config.resolve(env={"GANTRY_CONFIG": "/nonexistent/c.toml"}).api_url == (
        config.DEFAULT_API_URL
    )


def test_configure_stores_a_private_file_and_show_masks_the_key(gantry, isolated_client_config):
    secret = "gk_0123abcd_" + "s" * 40
    run = gantry("configure", "--api-url", "http://gantry.example:8000", "--api-key", secret)
    assert run.code == 0
    assert stat.S_IMODE(os.stat(isolated_client_config).st_mode) == 0o600
    assert config.load_file(isolated_client_config) == {
        "api_url": "http://gantry.example:8000",
        "api_key": secret,
    }

    shown = gantry("configure", "--show")
    assert shown.code == 0
    assert "http://gantry.example:8000" in shown.out
    assert "gk_0123abcd" in shown.out
    assert secret not in shown.out

    # Storing only the URL keeps the stored key.
    assert gantry("configure", "--api-url", "http://other:9").code == 0
    assert config.load_file(isolated_client_config)["api_key"] == secret


def test_configure_with_nothing_to_store_and_no_terminal_to_ask_on(gantry, isolated_client_config):
    run = gantry("configure")
    assert run.code == 2
    assert "Nothing to store: pass --api-url URL and/or --api-key KEY." in run.err
    assert not isolated_client_config.exists()


def test_config_file_that_is_not_toml_is_named_in_the_error(gantry, isolated_client_config):
    isolated_client_config.write_text("api_key = gk_unquoted\n")
    run = gantry("balance")
    assert run.code == 2
    assert str(isolated_client_config) in run.err
    assert "not valid TOML" in run.err


def test_next_cursor_reads_a_bare_cursor_or_one_inside_a_url():
    assert next_cursor({"next": "cD0yMDI2"}) == "cD0yMDI2"
    assert next_cursor({"next": "http://x/v1/jobs?status=queued&cursor=cD0yMDI2"}) == "cD0yMDI2"
    assert next_cursor({"next": None}) is None
    assert next_cursor({}) is None


def test_retry_after_in_seconds_or_as_an_http_date():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_balance_table_by_kind_with_upcoming_expirations():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    soon = (now + timedelta(days=3, hours=4)).isoformat()
    balance = {
        "available": 105_500_000,
        "held": 2_000_000,
        "total": 107_500_000,
        "by_kind": {"paid": 100_000_000, "promo": 5_000_000, "grant": 500_000},
        "buckets": [
            {"id": "b1", "kind": "paid", "remaining": 100_000_000, "held": 2_000_000},
            {"id": "b2", "kind": "promo", "remaining": 5_000_000, "held": 0, "expires_at": soon},
            {"id": "b3", "kind": "grant", "remaining": 500_000, "held": 0, "expires_at": None},
        ],
        "expiring_soon": [
            {"id": "b2", "kind": "promo", "remaining": 5_000_000, "expires_at": soon}
        ],
    }
    lines = render.balance_view(balance, now=now).splitlines()
    assert lines[0].split() == ["KIND", "AVAILABLE", "HELD"]
    assert lines[1].split() == ["paid", "100.000000", "2.000000"]
    assert lines[2].split() == ["promo", "5.000000", "0.000000"]
    assert lines[3].split() == ["grant", "0.500000", "0.000000"]
    assert lines[4].split() == ["total", "105.500000", "2.000000"]
    assert "Upcoming expirations:" in lines
    assert lines[-1].split() == [
        "promo",
        "5.000000",
        "2026-01-04",
        "04:00:00",
        "UTC",
        "in",
        "3d",
        "4h",
    ]


def test_sse_parser_follows_the_event_stream_rules():
    raw = (
        b": keep-alive\n"
        b"\n"
        b"event: job\r\n"
        b"id: 7\r\n"
        b'data: {"a":\r\n'
        b"data:  1}\r\n"
        b"\r\n"
        b"data:no space after the colon\n"
        b"retry: 100\n"
        b"unknown: ignored\n"
        b"\n"
        b"event: empty\n"
        b"\n"
        b"event: line\n"
        b"data: cut short by a dropped connection"
    )
    events = list(parse_sse(io.BytesIO(raw)))
    assert events == [
        None,  # the comment: the stream is alive
        ServerEvent("job", '{"a":\n 1}', "7"),
        ServerEvent("message", "no space after the colon", "7"),  # the last id stays
    ]


NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def followed(status: str, **more) -> dict:
    body = {
        "id": "j1",
        "status": status,
        "progress": 0.0,
        "attempts": 1,
        "gpu_type": None,
        "queue": None,
        "hold": {"amount": 66_667, "charged": 12_300, "refunded": 0, "state": "active"},
        "created_at": (NOW - timedelta(minutes=1, seconds=5)).isoformat(),
        "finished_at": None,
    }
    return body | more


def test_attempt_context_reads_placement_and_the_latest_requeue_from_events():
    events = [
        {"from": None, "to": "queued", "reason": "submitted"},
        {"from": "queued", "to": "scheduled", "reason": "placed on e2e-h100 GPU 0,1 (H100)"},
        {"from": "scheduled", "to": "running", "reason": "attempt 1 started on e2e-h100"},
        {"from": "preempting", "to": "queued", "reason": "preempted; resumes from its checkpoint"},
        {"from": "queued", "to": "scheduled", "reason": "placed on e2e-a100 GPU 3 (A100)"},
    ]
    assert render.attempt_context(events) == render.AttemptContext(
        node="e2e-a100", gpu_type="A100", requeued_after="preemption"
    )
    assert render.attempt_context([]) == render.AttemptContext()


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("preempted for a higher-priority job; it is requeued", "preemption"),
        ("The generator crashed (exit 1): boom Retrying in 2 s (failure 1 of 3).", "crash"),
        ("The generator ran out of GPU memory (exit 137): CUDA out of memory", "out-of-memory"),
        ("The generator printed nothing for 60 s and was killed as hung.", "hang"),
        ("The attempt's lease expired: its worker stopped heartbeating (lost).", "worker loss"),
        ("its worker shut down; resumes from its checkpoint on another", "worker shutdown"),
        ("something new", "failure"),
    ],
)
def test_why_a_job_went_back_to_the_queue(reason, cause):
    assert render.requeue_cause(reason) == cause


def test_status_line_of_a_running_job():
    context = render.AttemptContext(node="e2e-h100", gpu_type="H100", requeued_after="preemption")
    line = render.status_line(followed("running", progress=0.47, attempts=2), context, now=NOW)
    assert line == (
        "running 47% | attempt 2 after preemption | on e2e-h100 (H100) | 1m 05s elapsed | "
        "cost 0.012300 credits"
    )
    # The body's own GPU type wins over the events'; without a node, the GPU alone.
    line = render.status_line(
        followed("scheduled", gpu_type="A100"), render.AttemptContext(), now=NOW
    )
    assert line == "scheduled | attempt 1 | on A100 | 1m 05s elapsed | cost 0.012300 credits"


def test_status_line_of_a_queued_job():
    queue = {
        "position": 3,
        "reason": "waiting for an H100: 1 of 1 busy",
        "estimated_start_at": (NOW + timedelta(seconds=40)).isoformat(),
    }
    fresh = followed("queued", attempts=0, queue=queue, hold=None)
    assert render.status_line(fresh, render.AttemptContext(), now=NOW) == (
        "queued | #3 in queue: waiting for an H100: 1 of 1 busy, starts ~in 40s | 1m 05s elapsed"
    )
    unknown = followed("queued", attempts=0, queue={"position": None, "reason": None})
    assert render.status_line(unknown, render.AttemptContext(), now=NOW).startswith(
        "queued | in queue | 1m 05s elapsed"
    )
    again = followed("queued", progress=0.4, attempts=1, queue=queue | {"estimated_start_at": None})
    context = render.AttemptContext(node="e2e-h100", gpu_type="H100", requeued_after="crash")
    assert render.status_line(again, context, now=NOW) == (
        "queued 40% | retrying after crash | #3 in queue: waiting for an H100: 1 of 1 busy | "
        "1m 05s elapsed | cost 0.012300 credits"
    )


def test_status_line_of_a_finished_job_stops_its_clock():
    done = followed(
        "succeeded", progress=1.0, finished_at=(NOW - timedelta(seconds=20)).isoformat()
    )
    line = render.status_line(done, render.AttemptContext(node="n1"), now=NOW)
    assert line == "succeeded 100% | attempt 1 | on n1 | 45s elapsed | cost 0.012300 credits"


def test_status_view_on_a_log_prints_each_change_once():
    log = io.StringIO()
    view = render.StatusView(log, job_id="j1", now=lambda: NOW)
    context = render.AttemptContext(node="n1", gpu_type="H100")
    for status, progress, charged in [
        ("queued", 0.0, 0),
        ("queued", 0.0, 0),
        ("running", 0.0, 0),
        ("running", 0.004, 10),  # still 0%: the cost alone makes no new line
        ("running", 0.05, 20),
        ("running", 0.55, 30),
        ("running", 0.56, 40),
        ("running", 0.7, 50),
        ("succeeded", 1.0, 60),
    ]:
        view.update(followed(status, progress=progress, hold={"charged": charged}), context)
    view.close()
    lines = log.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "job j1: queued",
        "job j1: running 0%",
        "job j1: running 5%",
        "job j1: running 55%",
        "job j1: running 56%",
        "job j1: running 70%",
        "job j1: succeeded 100%",
    ]
    assert lines[-1].endswith("| cost 0.000060 credits")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_status_view_on_a_terminal_redraws_one_line_and_ends_it(monkeypatch):
    columns = 80
    monkeypatch.setattr(
        render.shutil, "get_terminal_size", lambda fallback: os.terminal_size((columns, 24))
    )
    screen = Terminal()
    view = render.StatusView(screen, job_id="j1", now=lambda: NOW, bar_width=10, tick_s=None)
    view.update(followed("running", progress=0.5, hold=None), render.AttemptContext(node="n1"))
    columns = 30  # a narrower terminal: the line is cut, never wrapped
    view.update(followed("running", progress=0.6, hold=None), render.AttemptContext(node="n1"))
    view.close()
    frames = screen.getvalue().split("\r")[1:]
    assert frames == [
        "[#####-----] running 50% | attempt 1 | on n1 | 1m 05s elapsed\x1b[K",
        "[######----] running 60% | at\x1b[K\n",
    ]


def test_status_view_on_a_terminal_keeps_its_clock_moving():
    screen = Terminal()
    clock = iter(NOW + timedelta(seconds=s) for s in range(1000))
    view = render.StatusView(screen, job_id="j1", now=lambda: next(clock), tick_s=0.01)
    view.update(followed("running", progress=0.5))
    deadline = time.monotonic() + 5
    while screen.getvalue().count("\r") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    view.close()
    assert screen.getvalue().count("\r") >= 3
    assert len({frame.split(" | ")[2] for frame in screen.getvalue().split("\r")[1:]}) >= 3


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (
            "Not enough credit: 0 µc available, 66667 µc requested.",
            "Not enough credit: 0.000000 credits available, 0.066667 credits requested.",
        ),
        (
            "0 µc held + 1500000 µc consumed + 66667 µc requested > limit 1 µc.",
            "0.000000 credits held + 1.500000 credits consumed + 0.066667 credits requested "
            "> limit 0.000001 credits.",
        ),
        ("Granted 2000000 micro-credits.", "Granted 2.000000 credits."),
        ("job 42 on GPU 3", "job 42 on GPU 3"),
    ],
)
def test_micro_credit_amounts_in_server_messages_read_as_credits(message, shown):
    assert render.amounts_in_credits(message) == shown


def test_job_detail_and_table_name_projects_and_fall_back_to_ids():
    names = {"p1": "studio"}
    named = followed("queued") | {"project": "p1", "resources": {"gpu_count": 1}}
    unnamed = followed("queued") | {"id": "j2", "project": "p9", "resources": {"gpu_count": 1}}
    detail = dict(line.split(None, 1) for line in render.job_detail(named, names).splitlines())
    assert detail["Project"] == "studio"
    table = render.jobs_table([named, unnamed], names).splitlines()
    assert [row.split()[3] for row in table[1:]] == ["studio", "p9"]
    assert "p1" in render.job_detail(named)  # no names read: the id


def test_status_of_a_queued_job_says_where_it_stands_why_and_when_it_should_start():
    queue = {
        "position": 2,
        "reason": "waiting for an H100: 1 of 1 busy",
        "estimated_start_at": (NOW + timedelta(seconds=90)).isoformat(),
    }
    waiting = followed("queued", attempts=0, queue=queue) | {"resources": {"gpu_count": 1}}
    detail = dict(line.split(None, 1) for line in render.job_detail(waiting, now=NOW).splitlines())
    assert detail["Queue"] == "#2 in queue: waiting for an H100: 1 of 1 busy, starts ~in 1m 30s"
    running = followed("running", queue=None) | {"resources": {"gpu_count": 1}}
    assert "Queue" not in render.job_detail(running, now=NOW)


def test_client_imports_neither_django_nor_the_server_apps():
    code = (
        "import sys, gantry_client.cli\n"
        "server = {m.split('.')[0] for m in sys.modules} & {'django', 'apps', 'rest_framework',"
        " 'celery', 'config'}\n"
        "print(sorted(server))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
    version = subprocess.run(
        [sys.executable, "-m", "gantry_client", "--version"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert version.returncode == 0
    assert version.stdout.strip() == "gantry 0.1.0"
