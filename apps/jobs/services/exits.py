"""How an attempt ended and what it costs: the exit policy, pure functions of settings.

An exit class says why the generator stopped; the classes decide whether a job is tried
again (with exponential backoff), counts against its max_attempts, or quarantines its
params. Usage is floor(GPU-milliseconds x price per GPU-hour / 3,600,000) micro-credits.
"""

from __future__ import annotations

import signal
from pathlib import Path

from django.conf import settings

from apps.jobs.models import ExitClass

# Exits that count against job.max_attempts (a preemption or a cancel does not).
FAILURE_CLASSES = frozenset(
    {ExitClass.CRASHED, ExitClass.OOM, ExitClass.HUNG, ExitClass.LOST, ExitClass.NODE_FAULT}
)
# Exits that may be tried again on another node while attempts remain.
RETRYABLE_CLASSES = FAILURE_CLASSES
# Exits that count towards quarantining the params fingerprint.
POISON_CLASSES = frozenset({ExitClass.CRASHED, ExitClass.HUNG})
MS_PER_HOUR = 3_600_000
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory")


def usage_micro_credits(*, gpu_ms: int, price_per_gpu_hour: int) -> int:
    """Micro-credits for `gpu_ms` GPU-milliseconds at a per-GPU-hour price (floored)."""
    return gpu_ms * price_per_gpu_hour // MS_PER_HOUR


def retry_backoff_s(failures: int) -> float:
    """Backoff before the next try after `failures` failed attempts (exponential, capped)."""
    base = settings.GANTRY_RETRY_BACKOFF_S
    return min(settings.GANTRY_RETRY_BACKOFF_MAX_S, base * 2 ** max(0, failures - 1))


def classify_exit(
    *, returncode: int, stop_reason: str, stderr_tail: str, output_files: list[Path]
) -> tuple[str, str]:
    """(exit class, error message) of a finished generator process.

    `stop_reason` is why the runner stopped it ("" if it exited on its own); a clean
    exit with exactly one output file is a success even if a stop was under way.
    """
    last_line = next((ln.strip() for ln in reversed(stderr_tail.splitlines()) if ln.strip()), "")
    if returncode == 0 and len(output_files) == 1:
        return ExitClass.SUCCEEDED, ""
    if stop_reason == ExitClass.HUNG:
        return ExitClass.HUNG, (
            f"The generator printed nothing for {settings.GANTRY_STALL_S:g} s and was killed "
            "as hung."
        )
    if stop_reason == ExitClass.TIMED_OUT:
        return ExitClass.TIMED_OUT, "The job ran past its max_runtime_s and was stopped."
    if stop_reason == ExitClass.KILLED:
        return ExitClass.KILLED, "Cancelled while running."
    if stop_reason == ExitClass.PREEMPTED:
        return ExitClass.PREEMPTED, "Preempted: stopped to make room, resumes from its checkpoint."
    lowered = stderr_tail.lower()
    if returncode == 137 or any(marker in lowered for marker in OOM_MARKERS):
        oom_line = next(
            (ln.strip() for ln in stderr_tail.splitlines() if "out of memory" in ln.lower()),
            last_line,
        )
        return ExitClass.OOM, f"The generator ran out of GPU memory (exit {returncode}): {oom_line}"
    if returncode == 2:
        return ExitClass.BAD_INPUT, f"The generator refused its input: {last_line}"
    if returncode == 0:
        return ExitClass.CRASHED, (
            f"The generator exited 0 with {len(output_files)} output files (expected one)."
        )
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else ""
        return (
            ExitClass.NODE_FAULT,
            f"The generator was killed by {name or -returncode} on the node.",
        )
    return ExitClass.CRASHED, f"The generator crashed (exit {returncode}): {last_line}"
