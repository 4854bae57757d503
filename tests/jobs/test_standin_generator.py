"""The stand-in generator, run as a real subprocess the way the runner runs it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
MODULE = "apps.jobs.standin_generator"
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"


def _env(devices: str = "0") -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["CUDA_VISIBLE_DEVICES"] = devices
    return env


class Job:
    """One attempt's directories: params.json, out/, ckpt/ under `root`."""

    def __init__(self, root: Path, params: dict | str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.params = root / "params.json"
        self.params.write_text(params if isinstance(params, str) else json.dumps(params))
        self.out = root / "out"
        self.ckpt = root / "ckpt"

    def argv(self, resume: bool = False) -> list[str]:
        argv = [sys.executable, "-m", MODULE, "--params", str(self.params)]
        argv += ["--output-dir", str(self.out), "--checkpoint-dir", str(self.ckpt)]
        return [*argv, "--resume"] if resume else argv

    def run(self, resume: bool = False, devices: str = "0") -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(resume),
            env=_env(devices),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def start(self, resume: bool = False) -> Live:
        return Live(self.argv(resume), cwd=self.root)

    def outputs(self) -> list[str]:
        return sorted(os.listdir(self.out)) if self.out.exists() else []

    def checkpoint(self) -> dict:
        return json.loads((self.ckpt / "checkpoint.json").read_text())


class Live:
    """A running generator whose stdout lines are read by a thread as they are printed."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv, env=_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, predicate, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"stdout closed early; saw {self.lines}")
            self.lines.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"timed out; saw {self.lines}")

    def drain(self) -> list[str]:
        """All stdout lines, once the process has exited."""
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return self.lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> Live:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
        self.proc.stdout.close()
        self.proc.stderr.close()


def progress(lines: list[str]) -> list[float]:
    return [float(line.split()[1]) for line in lines if line.startswith("PROGRESS ")]


def interrupt(job: Job, after_steps: int) -> tuple[int, float, list[str]]:
    """Start `job`, SIGTERM it once `after_steps` checkpoints exist; (code, seconds, stdout)."""
    with job.start() as live:
        live.wait_for(lambda line: line == f"CHECKPOINT step-{after_steps}")
        sent = time.monotonic()
        live.proc.send_signal(signal.SIGTERM)
        code = live.proc.wait(timeout=5)
        return code, time.monotonic() - sent, live.drain()


def test_success_writes_one_valid_deterministic_gif(tmp_path):
    params = {"prompt": "a red fox in snow", "seed": 7, "steps": 6, "step_seconds": 0.02}
    first, second = Job(tmp_path / "a", params), Job(tmp_path / "b", params)
    first.out.mkdir()
    (first.out / ".output.gif.tmp-99999").write_bytes(b"left by a killed attempt")

    results = [first.run(devices="0,1"), second.run(devices="0,1")]

    for job, result in zip((first, second), results, strict=True):
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "DEVICES 0,1"
        steps = progress(lines)
        assert steps == sorted(steps) and len(set(steps)) == 6 and steps[-1] == 1.0
        assert [line for line in lines if line.startswith("CHECKPOINT ")][-1] == "CHECKPOINT step-6"
        assert lines[-1] == "OUTPUT output.gif"
        assert job.outputs() == ["output.gif"]  # exactly one file, no temp leftovers
        assert os.listdir(job.ckpt) == ["checkpoint.json"]
        assert job.checkpoint()["step"] == 6
        with Image.open(job.out / "output.gif") as gif:
            assert gif.format == "GIF"
            assert gif.n_frames == 6
            assert gif.size == (96, 96)

    data = (first.out / "output.gif").read_bytes()
    assert data == (second.out / "output.gif").read_bytes()

    other = Job(tmp_path / "c", {**params, "seed": 8})
    assert other.run().returncode == 0
    assert (other.out / "output.gif").read_bytes() != data


def test_sigterm_checkpoints_and_exits_promptly(tmp_path):
    job = Job(tmp_path, {"prompt": "a red fox", "seed": 1, "steps": 40, "step_seconds": 0.05})

    code, seconds, lines = interrupt(job, after_steps=2)

    assert code == 143
    assert seconds < 2.0  # the runner's grace period is several seconds
    assert lines[-1].startswith("CHECKPOINT step-")
    step = job.checkpoint()["step"]
    assert lines[-1] == f"CHECKPOINT step-{step}"
    assert 2 <= step < 40
    assert job.outputs() == []
    assert os.listdir(job.ckpt) == ["checkpoint.json"]


def test_resume_continues_and_matches_uninterrupted_run(tmp_path):
    params = {"prompt": "a red fox", "seed": 3, "steps": 16, "step_seconds": 0.04}
    reference = Job(tmp_path / "ref", params)
    with Live(reference.argv(), cwd=reference.root) as ref_run:  # in parallel, to save time
        job = Job(tmp_path / "job", params)
        code, _, _ = interrupt(job, after_steps=3)
        assert code == 143
        step = job.checkpoint()["step"]

        result = job.run(resume=True)

        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[1] == f"RESUMED {step}"
        steps = progress(lines)
        assert len(steps) == 16 - step
        assert steps[0] > step / 16 and steps == sorted(steps) and steps[-1] == 1.0
        assert job.outputs() == ["output.gif"]
        assert ref_run.proc.wait(timeout=20) == 0
    assert (job.out / "output.gif").read_bytes() == (reference.out / "output.gif").read_bytes()


def test_resume_ignores_checkpoint_of_other_params(tmp_path):
    job = Job(tmp_path, {"prompt": "first", "steps": 2, "step_seconds": 0})
    assert job.run().returncode == 0
    job.params.write_text(json.dumps({"prompt": "second", "steps": 3, "step_seconds": 0}))

    result = job.run(resume=True)

    assert result.returncode == 0, result.stderr
    assert "RESUMED" not in result.stdout
    assert "does not match" in result.stderr
    assert len(progress(result.stdout.splitlines())) == 3


def test_crash_exits_1_with_traceback(tmp_path):
    job = Job(tmp_path, {"prompt": "a fox !crash", "steps": 10, "step_seconds": 0.01})

    result = job.run()

    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "RuntimeError" in result.stderr
    assert len(progress(result.stdout.splitlines())) == 2
    assert job.outputs() == []


def test_oom_exits_137_with_cuda_message(tmp_path):
    job = Job(tmp_path, {"prompt": "!oom a fox", "steps": 10, "step_seconds": 0.01})

    result = job.run()

    assert result.returncode == 137
    assert OOM_LINE in result.stderr
    assert "GiB total capacity" in result.stderr
    assert progress(result.stdout.splitlines()) == []
    assert job.outputs() == []


def test_hang_stops_progress_ignores_sigterm_dies_on_sigkill(tmp_path):
    job = Job(tmp_path, {"prompt": "a fox !hang", "steps": 10, "step_seconds": 0.02})
    with job.start() as live:
        live.wait_for(lambda line: line == "PROGRESS 0.3")
        live.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            live.proc.wait(timeout=1.0)  # 1 s is 50 steps' worth: it is stuck, not slow

        live.proc.kill()

        assert live.proc.wait(timeout=5) == -signal.SIGKILL
        assert progress(live.drain()) == [0.1, 0.2, 0.3]
    assert job.outputs() == []


def test_slow_takes_ten_times_longer_per_step(tmp_path):
    job = Job(tmp_path, {"prompt": "!slow fox", "steps": 2, "step_seconds": 0.05})
    started = time.monotonic()

    result = job.run()

    # A lower bound only (sleeps never end early): 2 steps x 10 x 0.05 s.
    assert time.monotonic() - started >= 1.0
    assert result.returncode == 0, result.stderr
    assert progress(result.stdout.splitlines()) == [0.5, 1.0]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"seed": 1, "steps": 3}, "'prompt'"),
        ({"prompt": "  "}, "'prompt'"),
        ({"prompt": "fox", "seed": 1.5}, "'seed'"),
        ({"prompt": "fox", "seed": -1}, "'seed'"),
        ({"prompt": "fox", "steps": "20"}, "'steps'"),
        ({"prompt": "fox", "steps": 0}, "'steps'"),
        ({"prompt": "fox", "steps": True}, "'steps'"),
        ({"prompt": "fox", "step_seconds": "fast"}, "'step_seconds'"),
        ({"prompt": "fox", "step_seconds": -0.5}, "'step_seconds'"),
        ([1, 2], "JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_bad_params_exit_2_naming_the_field(tmp_path, params, expected):
    job = Job(tmp_path, params)

    result = job.run()

    assert result.returncode == 2
    assert "invalid params" in result.stderr and expected in result.stderr
    assert "PROGRESS" not in result.stdout
    assert job.outputs() == []


def test_missing_params_file_or_argument_exit_2(tmp_path):
    job = Job(tmp_path, {"prompt": "fox"})
    job.params.unlink()
    result = job.run()
    assert result.returncode == 2
    assert "cannot read params file" in result.stderr

    argv = [sys.executable, "-m", MODULE, "--params", str(job.params)]
    result = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "--output-dir" in result.stderr
