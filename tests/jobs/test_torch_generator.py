"""The runner on a real GPU: scripts/torch_generator.py, a generator that computes with
PyTorch on the devices in CUDA_VISIBLE_DEVICES, run by real GPU-pool workers on a
one-GPU pool. Skipped, saying why, on a machine without PyTorch or without a CUDA GPU
(the stand-in generator covers the same paths everywhere else)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.fleet import liveness
from apps.jobs.models import ExitClass, JobEvent, JobStatus
from tests.jobs.factories import funded_org
from tests.ledger.assertions import assert_ledger_exact
from tests.worker_harness import ROOT, Beat, WorkerPool, job_now, submit_job

GENERATOR = ROOT / "scripts" / "torch_generator.py"
GPU_FLEET = {
    "gpu_types": {"H100": {"memory_gb": 80, "price_per_gpu_hour": 4_000_000}},
    "nodes": [{"name": "e2e-gpu", "gpus": [{"type": "H100", "device": "0"}]}],
}


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="PyTorch is not installed on this machine: the torch generator cannot run",
)
needs_cuda = pytest.mark.skipif(
    not cuda_available(),
    reason="no CUDA GPU on this machine (PyTorch missing or torch.cuda.is_available() False)",
)


def run_generator(tmp: Path, params: dict, *, resume: bool = False, env: dict | None = None):
    tmp.mkdir(exist_ok=True)
    (tmp / "params.json").write_text(json.dumps(params))
    argv = [sys.executable, str(GENERATOR), "--params", str(tmp / "params.json")]
    argv += ["--output-dir", str(tmp / "out"), "--checkpoint-dir", str(tmp / "checkpoint")]
    return subprocess.Popen(
        argv + (["--resume"] if resume else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@needs_torch
def test_a_run_stopped_by_sigterm_resumes_to_the_same_image_as_an_uninterrupted_run(
    tmp_path, monkeypatch
):
    if not cuda_available():
        monkeypatch.setenv("GANTRY_TORCH_DEVICE", "cpu")
    params = {"prompt": "a fox on a GPU", "seed": 3, "steps": 8, "step_seconds": 0.5}
    whole = run_generator(tmp_path / "whole", {**params, "step_seconds": 0})
    out, err = whole.communicate(timeout=120)
    assert whole.returncode == 0, err
    assert "OUTPUT output.png" in out

    first = run_generator(tmp_path / "parts", params)
    for line in first.stdout:  # stop it once it has saved a checkpoint, before the end
        if line.startswith("CHECKPOINT"):
            first.terminate()
            break
    first.communicate(timeout=30)
    assert first.returncode == 143
    assert not (tmp_path / "parts" / "out" / "output.png").exists()
    second = run_generator(tmp_path / "parts", params, resume=True)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    resumed = [line for line in out.splitlines() if line.startswith("RESUMED")]
    assert resumed and 0 < int(resumed[0].split()[1]) < 8, out
    image = (tmp_path / "parts" / "out" / "output.png").read_bytes()
    assert image[:8] == b"\x89PNG\r\n\x1a\n"
    assert image == (tmp_path / "whole" / "out" / "output.png").read_bytes()


# --- the platform's runner on a real GPU --------------------------------------------------


def e2e_device() -> str | None:
    """Where the end-to-end tests run the generator: the GPU; or the CPU when
    GANTRY_TORCH_DEVICE=cpu asks for it (the same path as a dry run on a machine without
    a GPU, telemetry aside); None: they skip."""
    if cuda_available():
        return "cuda"
    if importlib.util.find_spec("torch") and os.environ.get("GANTRY_TORCH_DEVICE") == "cpu":
        return "cpu"
    return None


needs_gpu_pool = pytest.mark.skipif(
    e2e_device() is None,
    reason="no CUDA GPU on this machine (PyTorch missing or torch.cuda.is_available() False)",
)


@pytest.fixture(scope="module")
def gpu_workers(django_db_setup, tmp_path_factory):
    pool = WorkerPool(tmp_path_factory.mktemp("gpu-workers"))
    pool.media_root.mkdir()
    pool.scratch_root.mkdir()
    # PyTorch's import and CUDA's start-up print nothing for seconds: on an H200 (the lent
    # machine of 2026-11-26) longer than FAST_SETTINGS' 3 s stall window, which ended
    # both runs as hung. The platform's default window is 300 s.
    env = {"GANTRY_GENERATOR_COMMAND": f"{sys.executable} {GENERATOR}", "GANTRY_STALL_S": "60"}
    try:
        pool.start("e2e-gpu", slots=1, extra_env=env)
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture
def beat(gpu_workers, settings):
    beat = Beat.over(gpu_workers, settings, fleet=GPU_FLEET)
    yield beat
    beat.drain(timeout=60, dispatch=True)


@needs_gpu_pool
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_on_one_gpu_an_enterprise_torch_job_preempts_a_free_one_which_resumes(beat, gpu_workers):
    free = submit_job(
        funded_org(tier="free"), prompt="a long free fox", steps=60, step_seconds=0.25
    )
    beat.until(lambda: job_now(free).progress >= 0.1, timeout=60)
    if e2e_device() == "cuda":  # while it computes, NVML sees its memory on the GPU
        readings = liveness.gpu_telemetry()
        assert readings and readings[0]["memory_used_mib"] > 0, readings
        print(f"GPU while the free job runs: {readings[0]}")

    urgent = submit_job(
        funded_org(tier="enterprise"), prompt="an urgent fox", steps=8, step_seconds=0.1
    )
    beat.until(lambda: job_now(urgent).started_at is not None, timeout=30)
    urgent = job_now(urgent)
    waited = (urgent.started_at - urgent.queued_at).total_seconds()
    print(f"one {e2e_device()} slot: the enterprise job started {waited:.1f} s after submission")
    assert waited <= 10, f"the enterprise job waited {waited:.1f} s"
    beat.until(lambda: job_now(urgent).is_terminal and job_now(free).is_terminal, timeout=120)

    for job in (job_now(urgent), job_now(free)):
        assert job.status == JobStatus.SUCCEEDED, gpu_workers.logs()
        result = Path(gpu_workers.media_root) / "results" / job.result_path
        assert result.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert_ledger_exact(job)
    free = job_now(free)
    assert free.preemption_count == 1
    reasons = list(JobEvent.objects.filter(job=free).values_list("reason", flat=True))
    assert any("resumed from its checkpoint at step" in reason for reason in reasons), reasons


@needs_cuda
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_real_cuda_out_of_memory_is_classified_retried_once_then_failed(beat, gpu_workers):
    job = submit_job(funded_org(), prompt="a fox too large !oom", steps=4, step_seconds=0.05)
    started = time.monotonic()
    beat.until(lambda: job_now(job).is_terminal, timeout=90)

    job = job_now(job)
    assert job.status == JobStatus.FAILED, gpu_workers.logs()
    assert job.error_code == "oom"
    assert "CUDA out of memory" in job.error_message
    attempts = list(job.attempts.order_by("number"))
    assert [(a.exit_class, a.exit_code) for a in attempts] == [(ExitClass.OOM, 137)] * 2
    assert_ledger_exact(job)
    print(f"a real CUDA OOM, classified and retried once, in {time.monotonic() - started:.1f} s")
