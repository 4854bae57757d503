"""The runner: the process supervisor of one attempt on a GPU worker.

It claims its attempt (attempts.claim_attempt), starts the black-box generator on the
attempt's GPUs, reads its PROGRESS / CHECKPOINT lines, heartbeats (attempts.heartbeat;
at once when a cancel or a preemption is announced, services.stop_requests), stops it
for a cancel, a preemption, a hang or max_runtime_s (SIGTERM, the grace period, then
SIGKILL of its process group), and finishes the attempt (attempts.finish_attempt),
which moves the job on and settles its money. Guarantees (docs/architecture.md, "The
flow of one job"):

- A duplicated, redelivered or late run message cannot claim and leaves without a write;
  a runner whose attempt was taken away (fenced) kills the generator and writes nothing.
  A runner that cannot renew its lease (its host cut off from the database) fences
  itself before the lease may run out: a watchdog thread, which no blocked database
  call can hold up, kills the generator LEASE_FENCE_SHARE of GANTRY_LEASE_S after the
  runner sent the last renewal the database accepted, so before the database's own
  expiry (counted from when it received that renewal), before the job can start
  elsewhere. The runner then pushes no checkpoint and stores no result, so when its
  link comes back it writes nothing over the attempt that took the job over.
- Durations come from time.monotonic() only; leases are computed by the database clock.
  A worker whose wall clock is skewed by hours charges exactly the time used.
- Usage is cumulative micro-credits (exits.usage_micro_credits), sent to the ledger on
  every heartbeat and handed over exactly at the finish.
- The job's max_runtime_s bounds its run time summed over attempts, so what a job is
  charged never exceeds the hold taken for max_runtime_s on the priciest allowed type.
- Checkpoints live in GANTRY_CHECKPOINT_ROOT/<job id>, a filesystem every node shares
  (like MEDIA_ROOT), or in the object store (GANTRY_CHECKPOINT_STORAGE s3: pulled before
  the start, pushed on every reported checkpoint and at the end; services/checkpoints.py),
  so a retry or a resumed preemption on any node continues from the last checkpoint
  (`--resume`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from apps.core.logging import job_log_context
from apps.jobs import metrics, selectors
from apps.jobs.models import (
    Attempt,
    ExitClass,
    Job,
)
from apps.jobs.services import checkpoints as checkpoint_store
from apps.jobs.services import logs, results, stop_requests
from apps.jobs.services.attempts import (
    Fenced,
    Finish,
    JobSignal,
    claim_attempt,
    finish_attempt,
    heartbeat,
)
from apps.jobs.services.exits import classify_exit, usage_micro_credits
from apps.jobs.services.logs import AttemptLog

logger = logging.getLogger(__name__)


STDERR_TAIL_BYTES = 8192
POLL_S = 0.05
# A runner fences itself at this share of GANTRY_LEASE_S without an accepted renewal:
# the rest is the margin for the watchdog's wake-up and the kill.
LEASE_FENCE_SHARE = 0.9
# A finish the database refused is tried again after these pauses (None: give up).
FINISH_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, None)


@dataclass(frozen=True)
class RunOutcome:
    attempt_id: str
    claimed: bool
    fenced: bool = False
    exit_class: str = ""
    exit_code: int | None = None
    job_status: str = ""


# --------------------------------------------------------------------------- the generator


def generator_command() -> list[str]:
    """GANTRY_GENERATOR_COMMAND, or the bundled stand-in run by this Python."""
    return list(settings.GANTRY_GENERATOR_COMMAND) or [
        sys.executable,
        "-m",
        "apps.jobs.standin_generator",
    ]


def checkpoint_dir(job_id) -> Path:
    """The shared checkpoint folder of the filesystem backend (see checkpoints.local_dir)."""
    return Path(settings.GANTRY_CHECKPOINT_ROOT) / str(job_id)


class _CheckpointPusher:
    """Pushes the working copy of a checkpoint to the object store in the background,
    so a big upload never delays a heartbeat; requests coalesce into the next push."""

    def __init__(self, job_id, directory: Path, *, may_write: Callable[[], bool]):
        self.job_id, self.directory, self.may_write = job_id, directory, may_write
        self._wanted = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        self._wanted.set()

    def _loop(self) -> None:
        while True:
            self._wanted.wait()
            if self._stopping:
                return
            self._wanted.clear()
            self._push("reported")

    def _push(self, why: str) -> None:
        if not self.may_write():  # the lease may have run out: the job may run elsewhere
            logger.warning("job %s: checkpoint (%s) not pushed: lease lost", self.job_id, why)
            return
        try:
            count = checkpoint_store.push(self.job_id, self.directory)
            logger.info("checkpoint (%s) pushed to the store: %d file(s)", why, count)
        except Exception:  # the store is down: the next push, or the final one, may pass
            logger.exception("job %s: the checkpoint could not be pushed", self.job_id)

    def stop(self) -> None:
        """Stop pushing in the background (waits for a push under way)."""
        self._stopping = True
        self._wanted.set()
        if self._thread is not None:
            self._thread.join()

    def final(self) -> None:
        """After the generator exited: stop, then push what it left, before the finish."""
        self.stop()
        self._push("final")


# --------------------------------------------------------------------------- the run

# Set when this worker process is shutting down (Celery's worker_shutting_down): every
# run hands its job back at once (SIGTERM, checkpoint, requeue) instead of being killed
# with the process and waiting for its lease to run out.
_draining = threading.Event()


def request_drain() -> None:
    """Stop every run of this process gracefully: their jobs go back to the queue."""
    _draining.set()


@dataclass
class _Output:
    """What the generator told on stdout so far."""

    progress: float | None = None
    progress_unsent: bool = False
    checkpoint: str = ""
    checkpoint_unsent: bool = False
    resumed: int | None = None
    resumed_unsent: bool = False

    def parse(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word == "PROGRESS":
            with contextlib.suppress(ValueError):
                value = float(rest)
                if 0.0 <= value <= 1.0:
                    self.progress, self.progress_unsent = value, True
        elif word == "CHECKPOINT" and rest:
            self.checkpoint, self.checkpoint_unsent = rest[:500], True
        elif word == "RESUMED":
            with contextlib.suppress(ValueError):
                self.resumed, self.resumed_unsent = int(rest), True


class _Generator:
    """The generator subprocess in its own session. Two threads read it: stdout lines go
    to `lines` (progress, checkpoints) and both streams' lines, as they arrive, to `log`;
    stderr is also written to `stderr_path` (its tail classifies the exit)."""

    def __init__(
        self, argv: list[str], *, cwd: Path, env: dict, stderr_path: Path, log: AttemptLog
    ):
        self._stderr = open(stderr_path, "wb")  # noqa: SIM115 (closed in wait())
        self.lines: queue.Queue = queue.Queue()
        self.log = log
        try:
            self.proc = subprocess.Popen(
                _with_parent_death_signal(argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: killpg reaches its children
            )
        except OSError:
            self._stderr.close()
            raise
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.log.add(line)
            self.lines.put((time.monotonic(), line.strip()))
        self.lines.put(None)

    def _read_stderr(self) -> None:
        for raw in self.proc.stderr:
            self._stderr.write(raw)
            self.log.add(raw.decode("utf-8", "replace").rstrip("\r\n"))
        self._stderr.flush()

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def wait(self) -> int:
        returncode = self.proc.wait()
        self.signal(signal.SIGKILL)  # anything it left behind in its group
        for reader in self._readers:
            reader.join(timeout=2)
        self._stderr.close()
        return returncode


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """Kill the generator if this worker dies (setpriv, where the node has it)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else argv


def _stderr_tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - STDERR_TAIL_BYTES))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _has_checkpoint(directory: Path) -> bool:
    return directory.is_dir() and any(not p.name.startswith(".") for p in directory.iterdir())


def _output_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")]


def run_attempt(attempt_id, fencing_token: int, *, worker: str = "") -> RunOutcome:
    """Claim the attempt, run the generator to its end, and finish the attempt.

    Safe against duplicates: only the delivery that claims the attempt runs anything.
    Stops the generator when the job is cancelled (SIGKILL), preempted or this worker
    shuts down (SIGTERM, then SIGKILL after GANTRY_PREEMPT_GRACE_S; the job is requeued
    with its checkpoint), past its max runtime (timed_out), silent for GANTRY_STALL_S
    (hung), or when a heartbeat finds the attempt taken away (fenced: killed, nothing
    written). The generator never outlives the run: whatever goes wrong, it is killed.
    See the module docstring for the accounting guarantees.
    """
    worker = worker or f"{os.uname().nodename}:{os.getpid()}"
    with job_log_context(attempt_id=attempt_id):
        claim_sent = time.monotonic()  # the claim starts the lease (database clock)
        attempt = claim_attempt(attempt_id, fencing_token, worker=worker)
        if attempt is None:
            return RunOutcome(str(attempt_id), claimed=False)
        run = _Run(attempt, worker=worker, lease_from=claim_sent)
    # Every line of the run names the job, the attempt, the org and the submitting request.
    request_id = selectors.submission_request_id(attempt.job_id)
    with job_log_context(job=run.job, attempt=attempt, request_id=request_id):
        logger.info(
            "attempt %d started on %s GPU %s (%s)",
            attempt.number,
            run.node,
            ",".join(map(str, attempt.gpu_indices)),
            attempt.gpu_type,
        )
        try:
            return run.execute()
        finally:
            shutil.rmtree(run.scratch, ignore_errors=True)


class _Run:
    """One claimed attempt being run: the generator, its heartbeats, its finish."""

    def __init__(self, attempt: Attempt, *, worker: str, lease_from: float):
        self.attempt = attempt
        # When the last lease renewal the database accepted was sent (monotonic): the
        # lease runs at least GANTRY_LEASE_S from then (see lease_lost).
        self.lease_from = lease_from
        self.worker = worker
        self.job = Job.objects.get(pk=attempt.job_id)
        earlier = self.job.attempts.exclude(pk=attempt.pk).values_list("gpu_ms", flat=True)
        # max_runtime_s bounds the run time of all attempts together (see the docstring).
        used_ms = sum(earlier) // max(1, self.job.gpu_count)
        self.budget_ms = max(0, self.job.max_runtime_s * 1000 - used_ms)
        self.gpu_count = len(attempt.gpu_indices)
        self.scratch = Path(settings.GANTRY_SCRATCH_ROOT) / str(attempt.pk)
        self.output_dir = self.scratch / "output"
        self.out = _Output()
        self.seq = 0
        self.started = time.monotonic()
        self.renewed = self.started  # the lease's latest renewal (heartbeat lag)
        self.node = attempt.node.name
        self.stop_reason = ""
        self.log = AttemptLog()
        self.checkpoints = checkpoint_store.local_dir(self.job.pk, self.scratch)
        self.pusher = (
            _CheckpointPusher(
                self.job.pk, self.checkpoints, may_write=lambda: not self.lease_lost()
            )
            if checkpoint_store.remote_store() is not None
            else None
        )

    # -- accounting ---------------------------------------------------------------------

    def gpu_ms(self, now: float) -> int:
        # Never bill past the runtime the job has left (the kill lands a poll later).
        return min(int((now - self.started) * 1000), self.budget_ms) * self.gpu_count

    def charge(self, gpu_ms: int) -> int:
        return usage_micro_credits(
            gpu_ms=gpu_ms, price_per_gpu_hour=self.attempt.price_per_gpu_hour
        )

    def lease_lost(self, now: float | None = None) -> bool:
        """Whether the lease may soon run out: the database may give the job to another
        attempt, so this run must neither go on nor write anything."""
        elapsed = (now or time.monotonic()) - self.lease_from
        return elapsed >= LEASE_FENCE_SHARE * settings.GANTRY_LEASE_S

    def _watch_lease(self, gen: _Generator, done: threading.Event) -> None:
        """The watchdog: kill the generator as soon as the lease is lost, whatever the
        supervising loop is waiting on (a heartbeat blocked on a dead link)."""
        while not done.wait(POLL_S):
            if self.lease_lost():
                gen.signal(signal.SIGKILL)
                logger.warning(
                    "attempt %s: no lease renewal accepted for %.1f s; generator killed",
                    self.attempt.pk,
                    time.monotonic() - self.lease_from,
                )
                return

    def _fence_for_lost_lease(self, gen: _Generator) -> RunOutcome:
        """Kill the generator and leave without a write (the log stays on the worker)."""
        gen.signal(signal.SIGKILL)
        gen.wait()
        logger.warning(
            "attempt %s fenced: its lease was lost; nothing written (the job resumes elsewhere)",
            self.attempt.pk,
        )
        metrics.LEASES_LOST.inc()
        return RunOutcome(str(self.attempt.pk), claimed=True, fenced=True)

    # -- the run ------------------------------------------------------------------------

    def execute(self) -> RunOutcome:
        try:
            gen = self._start()
        except OSError as exc:  # the node cannot run it (disk, binary): another node may
            logger.exception("attempt %s: the generator did not start", self.attempt.pk)
            return self._finish(
                Finish(ExitClass.NODE_FAULT, None, 0, 0, f"The generator did not start: {exc}")
            )
        supervised = threading.Event()
        watchdog = threading.Thread(
            # With this run's log context (job, attempt): a thread starts without it.
            target=contextvars.copy_context().run,
            args=(self._watch_lease, gen, supervised),
            name="lease-watchdog",
            daemon=True,
        )
        watchdog.start()
        try:
            with stop_requests.watch(self.job.pk) as stop_nudged:
                return self._supervise(gen, stop_nudged)
        finally:
            supervised.set()
            if gen.proc.poll() is None:  # an error in here must not leave it running
                gen.signal(signal.SIGKILL)
                gen.wait()
            if self.pusher is not None:
                self.pusher.stop()

    def _start(self) -> _Generator:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        checkpoints = self.checkpoints
        checkpoints.mkdir(parents=True, exist_ok=True)
        try:
            pulled = checkpoint_store.pull(self.job.pk, checkpoints)
        except Exception as exc:  # the store unreachable from here: not a run from step 0
            raise OSError(f"the checkpoint could not be fetched from the store: {exc}") from exc
        if pulled:
            logger.info("checkpoint pulled from the store: %d file(s)", pulled)
        params = self.scratch / "params.json"
        params.write_text(json.dumps(self.job.params))
        argv = [
            *generator_command(),
            "--params",
            str(params),
            "--output-dir",
            str(self.output_dir),
            "--checkpoint-dir",
            str(checkpoints),
        ]
        if _has_checkpoint(checkpoints):
            argv.append("--resume")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": self.attempt.devices}
        if not settings.GANTRY_GENERATOR_COMMAND:  # the stand-in: importable from any cwd
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(settings.BASE_DIR), env.get("PYTHONPATH", "")) if p
            )
        self.started = self.renewed = time.monotonic()
        return _Generator(
            argv, cwd=self.scratch, env=env, stderr_path=self.scratch / "stderr.log", log=self.log
        )

    def _supervise(self, gen: _Generator, stop_nudged: threading.Event) -> RunOutcome:
        last_output = self.started
        next_beat = self.started + settings.GANTRY_HEARTBEAT_S
        kill_at: float | None = None
        while True:
            for at, line in self._drain_lines(gen, timeout=POLL_S):
                last_output = at
                self.out.parse(line)
            logs.publish_lines(self.attempt.pk, self.log.take_pending())
            now = time.monotonic()
            if self.lease_lost(now):
                return self._fence_for_lost_lease(gen)
            if gen.proc.poll() is not None:
                ended = now
                break
            if not self.stop_reason:
                if now - last_output > settings.GANTRY_STALL_S:
                    self._stop(gen, ExitClass.HUNG)
                elif (now - self.started) * 1000 >= self.budget_ms:
                    self._stop(gen, ExitClass.TIMED_OUT)
                elif _draining.is_set():
                    kill_at = self._stop(gen, ExitClass.PREEMPTED)
            if kill_at is not None and now >= kill_at:
                gen.signal(signal.SIGKILL)
                kill_at = None
            if stop_nudged.is_set():  # a cancel or preemption was announced: look now
                stop_nudged.clear()
                next_beat = now
            if now >= next_beat:
                next_beat = now + settings.GANTRY_HEARTBEAT_S
                job_signal = self._heartbeat(now)
                if job_signal is None:
                    gen.signal(signal.SIGKILL)
                    gen.wait()
                    self._keep_log()
                    logger.warning("attempt %s was taken away; generator killed", self.attempt.pk)
                    return RunOutcome(str(self.attempt.pk), claimed=True, fenced=True)
                if job_signal is not False and not self.stop_reason:
                    if job_signal.cancel:
                        self._stop(gen, ExitClass.KILLED)
                    elif job_signal.preempt:
                        kill_at = self._stop(gen, ExitClass.PREEMPTED)

        returncode = gen.wait()
        for _, line in self._drain_lines(gen, timeout=0):  # printed just before the exit
            self.out.parse(line)
        finish = None if self.lease_lost() else self._outcome(returncode, ended)
        if finish is None:
            return self._fence_for_lost_lease(gen)
        return self._finish(finish)

    def _stop(self, gen: _Generator, reason: str) -> float | None:
        """Stop the generator for `reason`; returns when to SIGKILL it if it lingers."""
        self.stop_reason = reason
        if reason == ExitClass.PREEMPTED:  # let it checkpoint first
            gen.signal(signal.SIGTERM)
            return time.monotonic() + settings.GANTRY_PREEMPT_GRACE_S
        gen.signal(signal.SIGKILL)
        return None

    @staticmethod
    def _drain_lines(gen: _Generator, *, timeout: float) -> list[tuple[float, str]]:
        lines = []
        try:
            item = gen.lines.get(timeout=timeout) if timeout else gen.lines.get_nowait()
            while True:
                if item is not None:
                    lines.append(item)
                item = gen.lines.get_nowait()
        except queue.Empty:
            return lines

    def _heartbeat(self, now: float) -> JobSignal | bool | None:
        """heartbeat(); False if the database could not be reached this time."""
        self.seq += 1
        gpu_ms = self.gpu_ms(now)
        out = self.out
        reports_checkpoint = out.checkpoint_unsent
        sent = time.monotonic()
        try:
            job_signal = heartbeat(
                self.attempt,
                gpu_ms=gpu_ms,
                charged=self.charge(gpu_ms),
                seq=self.seq,
                progress=out.progress if out.progress_unsent else None,
                checkpoint=out.checkpoint if out.checkpoint_unsent else "",
                resumed_step=out.resumed if out.resumed_unsent else None,
            )
        except DatabaseError as exc:
            metrics.HEARTBEATS.labels("error").inc()
            # Keep running: the next heartbeat may get through before the lease runs out,
            # and if it does not, the reaper requeues the job and this run is fenced.
            logger.warning("attempt %s: heartbeat failed: %s", self.attempt.pk, exc)
            close_old_connections()
            return False
        out.progress_unsent = out.checkpoint_unsent = out.resumed_unsent = False
        metrics.HEARTBEATS.labels("ok" if job_signal is not None else "fenced").inc()
        if job_signal is not None and reports_checkpoint and self.pusher is not None:
            self.pusher.request()  # still this attempt's: its checkpoint goes to the store
        if job_signal is not None:
            self.lease_from = sent
            renewed = time.monotonic()
            metrics.HEARTBEAT_LAG.labels(node=self.node).observe(renewed - self.renewed)
            self.renewed = renewed
        return job_signal

    def _outcome(self, returncode: int, ended: float) -> Finish | None:
        """How the run ended, its result stored; None when the lease was lost meanwhile
        (the final push can take a while) and nothing more may be written."""
        gpu_ms = self.gpu_ms(ended)
        if self.pusher is not None:  # before the finish, so the next attempt pulls it
            self.pusher.final()
        if self.lease_lost():
            return None
        files = _output_files(self.output_dir)
        exit_class, message = classify_exit(
            returncode=returncode,
            stop_reason=self.stop_reason,
            stderr_tail=_stderr_tail(self.scratch / "stderr.log"),
            output_files=files,
        )
        result_path = ""
        if exit_class == ExitClass.SUCCEEDED:
            try:
                result_path = results.store_result(self.job, files[0])
            except OSError as exc:
                exit_class, message = ExitClass.NODE_FAULT, f"The output could not be stored: {exc}"
        return Finish(
            exit_class=exit_class,
            exit_code=returncode,
            gpu_ms=gpu_ms,
            charged=self.charge(gpu_ms),
            error_message=message,
            checkpoint=self.out.checkpoint,
            result_path=result_path,
            resumed_step=self.out.resumed,
        )

    def _keep_log(self) -> None:
        """Store the attempt's log and tell its followers it ended (before the attempt's
        end is recorded, so a tenant who sees the job end finds the log)."""
        logs.publish_lines(self.attempt.pk, self.log.take_pending())
        try:
            logs.store_attempt_log(self.job, self.attempt.number, self.log)
        except Exception:  # storage down: the run's outcome matters more than its log
            logger.exception("attempt %s: its log could not be stored", self.attempt.pk)
        logs.publish_end(self.attempt.pk)

    def _finish(self, finish: Finish) -> RunOutcome:
        attempt = self.attempt
        self._keep_log()
        for delay in FINISH_RETRY_DELAYS_S:
            try:
                job = finish_attempt(attempt, finish, worker=self.worker)
                break
            except Fenced:
                logger.warning("attempt %s was taken away before its finish", attempt.pk)
                return RunOutcome(str(attempt.pk), claimed=True, fenced=True)
            except DatabaseError as exc:
                if delay is None:  # give up: the lease runs out and the reaper requeues it
                    raise
                logger.warning("attempt %s: finish failed (%s); retrying", attempt.pk, exc)
                close_old_connections()
                time.sleep(delay)
        metrics.ATTEMPTS.labels(finish.exit_class).inc()
        metrics.GPU_SECONDS.inc(finish.gpu_ms / 1000)
        logger.info(
            "attempt %d ended %s (exit %s, %d GPU-ms, %d micro-credits); job %s",
            attempt.number,
            finish.exit_class,
            finish.exit_code,
            finish.gpu_ms,
            finish.charged,
            job.status,
        )
        return RunOutcome(
            str(attempt.pk),
            claimed=True,
            exit_class=finish.exit_class,
            exit_code=finish.exit_code,
            job_status=job.status,
        )


__all__ = [
    "RunOutcome",
    "checkpoint_dir",
    "generator_command",
    "request_drain",
    "run_attempt",
]
