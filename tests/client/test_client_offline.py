"""The client's own logic, no server: amounts, arguments, request bodies, configuration."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gantry_client import config, render
from gantry_client.api import next_cursor, parse_retry_after
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


def test_progress_bar_on_a_log_prints_a_line_per_status_or_tenth(tmp_path):
    log = (tmp_path / "log.txt").open("w+")
    bar = render.ProgressBar(log, job_id="j1")
    for status, progress in [
        ("queued", 0.0),
        ("queued", 0.0),
        ("running", 0.0),
        ("running", 0.05),
        ("running", 0.55),
        ("running", 0.56),
        ("succeeded", 1.0),
    ]:
        bar.update({"status": status, "progress": progress})
    bar.close()
    log.seek(0)
    lines = log.read().splitlines()
    assert [line.split()[4] for line in lines] == ["queued", "running", "running", "succeeded"]
    assert [line.split()[3] for line in lines] == ["0%", "0%", "55%", "100%"]


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
