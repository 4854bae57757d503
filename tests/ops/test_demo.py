"""The demo driver's pure parts: statistics and formatting of what it prints."""

import importlib.util
import random
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "gantry_demo", Path(__file__).resolve().parents[2] / "scripts" / "demo.py"
)
demo = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = demo  # dataclasses look their module up there
_SPEC.loader.exec_module(demo)


def _job(status, *, created, started=None, finished=None, gpus=1):
    stamp = "2030-01-01T00:00:{:06.3f}Z".format
    return {
        "status": status,
        "created_at": stamp(created),
        "started_at": stamp(started) if started is not None else None,
        "finished_at": stamp(finished) if finished is not None else None,
        "resources": {"gpu_count": gpus},
    }


def test_percentile_uses_nearest_rank_and_handles_no_values():
    values = [float(v) for v in range(1, 101)]
    assert demo.percentile(values, 0.5) == 50.0
    assert demo.percentile(values, 0.95) == 95.0
    assert demo.percentile([3.0], 0.95) == 3.0
    assert demo.percentile([], 0.5) is None


def test_start_waits_skip_jobs_that_never_started():
    jobs = [
        _job("succeeded", created=1, started=3.5, finished=6),
        _job("queued", created=2),
        _job("running", created=4, started=4.25),
    ]
    assert demo.start_waits(jobs) == [2.5, 0.25]


def test_utilisation_clips_jobs_to_the_window_and_counts_gpus():
    begin = demo.parse_time("2030-01-01T00:00:10Z")
    jobs = [
        _job("succeeded", created=0, started=5, finished=15, gpus=2),  # 5 s in window × 2
        _job("running", created=10, started=20),  # runs to the window's end: 10 s
        _job("queued", created=12),
    ]
    share = demo.gpu_utilisation(jobs, fleet_gpus=4, window=(begin, begin + 20))
    assert share == pytest.approx(20 / 80)
    assert demo.gpu_utilisation(jobs, fleet_gpus=0, window=(begin, begin + 20)) == 0.0


def test_status_line_groups_statuses_per_tier():
    jobs = [
        _job(status, created=0)
        for status in ("queued", "scheduled", "running", "succeeded", "timed_out", "failed")
    ]
    counts = demo.status_counts(jobs)
    assert counts == {"queued": 2, "running": 1, "succeeded": 1, "failed": 2}
    line = demo.format_status(12.0, {"free": counts, "paid": dict.fromkeys(counts, 0)})
    assert "free q/r/ok/fail 2/1/1/2" in line
    assert "paid q/r/ok/fail 0/0/0/0" in line


def test_wait_table_shows_dashes_for_a_tier_where_nothing_started():
    table = demo.format_wait_table({"free": [], "paid": [1.0, 3.0]}, {"free": 4})
    free_row, paid_row = table.splitlines()[1:]
    assert free_row.split() == ["free", "0", "4", "-", "-", "-"]
    assert paid_row.split() == ["paid", "2", "0", "1.0", "3.0", "3.0"]


def test_job_specs_are_short_and_some_prompts_misbehave():
    rng = random.Random(1)
    specs = [demo.job_spec(rng, project="p", misbehave_share=0.2) for _ in range(200)]
    bad = [s for s in specs if any(m in s["params"]["prompt"] for m in demo.MISBEHAVING)]
    assert 10 < len(bad) < 80
    assert all(s["params"]["steps"] * s["params"]["step_seconds"] <= 4 for s in specs)
    assert {s["resources"]["gpu_count"] for s in specs} == {1, 2}
