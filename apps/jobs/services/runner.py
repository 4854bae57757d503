"""The runner: claim one attempt, run the black-box generator on its GPUs, finish it.

Guarantees (docs/architecture.md, "The flow of one job"):

- A run starts only by claiming its attempt with a guarded UPDATE that checks the
  fencing token and both states (attempt `scheduled`, job `scheduled`). A duplicated,
  redelivered or late run message cannot claim and leaves without a single write.
- Every later write (heartbeat, finish) is guarded by the same token and a live attempt
  state. When a guard finds no row the attempt was taken away (its lease was reaped, the
  job moved on): the generator is killed at once and nothing else is written.
- Durations come from time.monotonic() only; leases are computed by the database clock
  (`now()`). A worker whose wall clock is skewed by hours charges exactly the time used.
- Usage is cumulative micro-credits, floor(elapsed_ms x gpus x price / 3,600,000), sent
  to the ledger's batched path on every heartbeat and written to the attempt row; the
  finish hands the exact final figure to the ledger in the transaction that ends the
  attempt (settle on a terminal status, meter when the job goes back to the queue).
- The job's max_runtime_s bounds its run time summed over attempts, so what a job is
  charged never exceeds the hold taken for max_runtime_s on the priciest allowed type.
- Checkpoints live in GANTRY_CHECKPOINT_ROOT/<job id>, assumed to be a filesystem every
  node shares (like MEDIA_ROOT), so a retry or a resumed preemption on any node continues
  from the last checkpoint (`--resume`).
"""

from __future__ import annotations

import contextlib
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
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Greatest, Now
from prometheus_client import Counter

from apps.core.logging import job_log_context
from apps.core.wakeup import wake_dispatcher
from apps.jobs import metrics, selectors
from apps.jobs.models import (
    TERMINAL_STATUSES,
    Attempt,
    AttemptState,
    ExitClass,
    GpuAssignment,
    Job,
    JobStatus,
)
from apps.jobs.services import lifecycle, quarantine, results

logger = logging.getLogger(__name__)

# Served by /metrics (PROMETHEUS_MULTIPROC_DIR gathers the worker processes' series).
ATTEMPTS = Counter(
    "gantry_runner_attempts_total", "Attempts run to their end, by exit class.", ["exit_class"]
)
HEARTBEATS = Counter(
    "gantry_runner_heartbeats_total", "Heartbeats by outcome (ok, fenced, error).", ["outcome"]
)
GPU_SECONDS = Counter("gantry_runner_gpu_seconds_total", "GPU-seconds used by finished attempts.")

LIVE_ATTEMPT_STATES = (AttemptState.RUNNING, AttemptState.STOPPING)
# Exits that count against job.max_attempts (a preemption or a cancel does not).
FAILURE_CLASSES = frozenset(
    {ExitClass.CRASHED, ExitClass.OOM, ExitClass.HUNG, ExitClass.LOST, ExitClass.NODE_FAULT}
)
# Exits that may be tried again on another node while attempts remain.
RETRYABLE_CLASSES = FAILURE_CLASSES
# Exits that count towards quarantining the params fingerprint.
POISON_CLASSES = frozenset({ExitClass.CRASHED, ExitClass.HUNG})
# Reported after every heartbeat's seq: the attempt's last word to the ledger.
FINAL_SEQ = 2**62
MS_PER_HOUR = 3_600_000
STDERR_TAIL_BYTES = 8192
POLL_S = 0.05
# A finish the database refused is tried again after these pauses (None: give up).
FINISH_RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, None)
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory")


class Fenced(Exception):
    """A guarded write found no row: this runner no longer owns the attempt."""


@dataclass(frozen=True)
class RunOutcome:
    attempt_id: str
    claimed: bool
    fenced: bool = False
    exit_class: str = ""
    exit_code: int | None = None
    job_status: str = ""


@dataclass(frozen=True)
class JobSignal:
    """What a heartbeat learns about the job: keep going, stop for a cancel or preemption."""

    status: str
    cancel_requested: bool
    stopping: bool

    @property
    def cancel(self) -> bool:
        # Cancel requested, or the job was ended under it (an operator, an expired hold).
        return self.cancel_requested or self.status in TERMINAL_STATUSES

    @property
    def preempt(self) -> bool:
        return self.status == JobStatus.PREEMPTING or self.stopping


# --------------------------------------------------------------------------- pure helpers


def generator_command() -> list[str]:
    """GANTRY_GENERATOR_COMMAND, or the bundled stand-in run by this Python."""
    return list(settings.GANTRY_GENERATOR_COMMAND) or [
        sys.executable,
        "-m",
        "apps.jobs.standin_generator",
    ]


def usage_micro_credits(*, gpu_ms: int, price_per_gpu_hour: int) -> int:
    """Micro-credits for `gpu_ms` GPU-milliseconds at a per-GPU-hour price (floored)."""
    return gpu_ms * price_per_gpu_hour // MS_PER_HOUR


def retry_backoff_s(failures: int) -> float:
    """Backoff before the next try after `failures` failed attempts (exponential, capped)."""
    base = settings.GANTRY_RETRY_BACKOFF_S
    return min(settings.GANTRY_RETRY_BACKOFF_MAX_S, base * 2 ** max(0, failures - 1))


def checkpoint_dir(job_id) -> Path:
    return Path(settings.GANTRY_CHECKPOINT_ROOT) / str(job_id)


def nodes_to_avoid(job_ids) -> dict:
    """{job id: {node id}} of nodes where the job's earlier attempts failed.

    The dispatcher places a retry elsewhere when it can (and on one of these nodes
    rather than not at all).
    """
    avoid: dict = {}
    rows = Attempt.objects.filter(job_id__in=list(job_ids), exit_class__in=FAILURE_CLASSES)
    for job_id, node_id in rows.values_list("job_id", "node_id"):
        avoid.setdefault(job_id, set()).add(node_id)
    return avoid


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


# --------------------------------------------------------------------------- claim


def claim_attempt(attempt_id, fencing_token: int, *, worker: str) -> Attempt | None:
    """Make the attempt `running` and its job `running`, or change nothing.

    One transaction: the job row is locked first (the platform's lock order), then one
    guarded UPDATE claims the attempt only if it is still `scheduled` with this fencing
    token and its job is `scheduled`. Returns None for a duplicate, late or stale
    delivery. A scheduled attempt whose job has already left `scheduled` (cancelled
    before it started) is closed and its GPUs given back.
    """
    attempt = Attempt.objects.filter(pk=attempt_id, fencing_token=fencing_token).first()
    if attempt is None:
        return None
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=attempt.job_id)
        lease = timedelta(seconds=settings.GANTRY_LEASE_S)
        claimed = Attempt.objects.filter(
            pk=attempt.pk,
            fencing_token=fencing_token,
            state=AttemptState.SCHEDULED,
            job__status=JobStatus.SCHEDULED,
        ).update(
            state=AttemptState.RUNNING,
            lease_expires_at=Now() + lease,
            started_at=Now(),
            worker=worker[:200],
            checkpoint_ref=job.checkpoint_ref,
        )
        if not claimed:
            _close_orphaned(attempt, job, fencing_token)
            return None
        attempt.refresh_from_db()
        lifecycle.transition(
            job.pk,
            to=JobStatus.RUNNING,
            reason=f"attempt {attempt.number} started on {attempt.node.name}",
            actor=f"worker:{worker}"[:100],
            only_from=[JobStatus.SCHEDULED],
            attempt=attempt,
            changes={
                "started_at": Coalesce(F("started_at"), Now()),
                "gpu_type": attempt.gpu_type,
            },
        )
    metrics.observe_start_wait(
        tier=job.tier, queued_at=job.queued_at, started_at=attempt.started_at
    )
    return attempt


def _close_orphaned(attempt: Attempt, job: Job, fencing_token: int) -> None:
    """Finish a still-scheduled attempt whose job is no longer scheduled; free its GPUs."""
    if job.status == JobStatus.SCHEDULED:
        return
    closed = Attempt.objects.filter(
        pk=attempt.pk, fencing_token=fencing_token, state=AttemptState.SCHEDULED
    ).update(
        state=AttemptState.FINISHED,
        exit_class=ExitClass.KILLED,
        error_message=f"Never started: the job was {job.status} before it was claimed.",
        finished_at=Now(),
    )
    if closed:
        GpuAssignment.objects.filter(attempt=attempt, released_at__isnull=True).update(
            released_at=Now()
        )
        wake_dispatcher()


# --------------------------------------------------------------------------- heartbeat


def heartbeat(
    attempt: Attempt,
    *,
    gpu_ms: int,
    charged: int,
    seq: int,
    progress: float | None = None,
    checkpoint: str = "",
    resumed_step: int | None = None,
) -> JobSignal | None:
    """Extend the lease, record usage and progress; None when the attempt was taken away.

    The lease is extended from the database clock; the attempt UPDATE is guarded by the
    fencing token and a live state, so a fenced runner writes nothing. Usage goes to the
    ledger's batched path (Redis) after the commit; losing it loses nothing, since the
    attempt row carries the same figure and the finish reports it again. `resumed_step`
    (sent once, after the generator printed RESUMED) notes the resume in the event log.
    """
    lease = timedelta(seconds=settings.GANTRY_LEASE_S)
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(no_key=True)
            .only("status", "cancel_requested", "progress", "hold_id")
            .get(pk=attempt.job_id)
        )
        updates = {
            "lease_expires_at": Now() + lease,
            "gpu_ms": Greatest(F("gpu_ms"), gpu_ms),
            "charged": Greatest(F("charged"), charged),
        }
        if checkpoint:
            updates["checkpoint_ref"] = checkpoint
            updates["checkpointed_at"] = Now()  # preemption victims are scored by it
        alive = Attempt.objects.filter(
            pk=attempt.pk, fencing_token=attempt.fencing_token, state__in=LIVE_ATTEMPT_STATES
        ).update(**updates)
        if not alive:
            return None
        job_updates = {}
        if (
            progress is not None
            and progress > job.progress
            and job.status
            in (
                JobStatus.RUNNING,
                JobStatus.PREEMPTING,
            )
        ):
            job_updates["progress"] = min(1.0, progress)
        if checkpoint:
            job_updates["checkpoint_ref"] = checkpoint
        if job_updates and job.status not in TERMINAL_STATUSES:
            Job.objects.filter(pk=job.pk).update(**job_updates)
        if resumed_step is not None:
            lifecycle.record_event(
                job,
                reason=f"attempt {attempt.number} resumed from its checkpoint at step "
                f"{resumed_step}",
                actor=f"worker:{attempt.worker}"[:100],
                data={"attempt": attempt.number, "resumed_step": resumed_step},
            )
        stopping = Attempt.objects.filter(pk=attempt.pk, state=AttemptState.STOPPING).exists()
    if job.hold_id is not None and charged > 0:
        _report_usage(job.hold_id, attempt, charged=charged, seq=seq)
    return JobSignal(job.status, job.cancel_requested, stopping)


def _report_usage(hold_id, attempt: Attempt, *, charged: int, seq: int) -> None:
    from apps.ledger import services as ledger

    try:
        ledger.record_usage(
            hold_id=hold_id, attempt_key=str(attempt.pk), cumulative_usage=charged, seq=seq
        )
    except Exception as exc:  # Redis is hot, rebuildable state: the finish reports again
        logger.warning("usage report for attempt %s not sent: %s", attempt.pk, exc)


# --------------------------------------------------------------------------- finish


@dataclass
class Finish:
    """How an attempt ended, as measured by its runner."""

    exit_class: str
    exit_code: int | None
    gpu_ms: int
    charged: int
    error_message: str = ""
    checkpoint: str = ""
    result_path: str = ""
    resumed_step: int | None = None


def finish_attempt(attempt: Attempt, finish: Finish, *, worker: str) -> Job:
    """End the attempt and move its job on, in one transaction; raise Fenced if not ours.

    The job row is locked first, then the attempt is finished by a guarded UPDATE (token
    and live state), its GPUs released and the job transitioned: succeeded, cancelled,
    timed_out, failed, or back to the queue (retry with backoff, or the resume of a
    preemption) with its checkpoint. A terminal transition settles the hold at the usage
    of all attempts, this one at exactly `finish.charged`; a requeue meters it.
    """
    actor = f"worker:{worker}"[:100]
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=attempt.job_id)
        done = Attempt.objects.filter(
            pk=attempt.pk, fencing_token=attempt.fencing_token, state__in=LIVE_ATTEMPT_STATES
        ).update(
            state=AttemptState.FINISHED,
            exit_class=finish.exit_class,
            exit_code=finish.exit_code,
            error_message=finish.error_message,
            finished_at=Now(),
            gpu_ms=Greatest(F("gpu_ms"), finish.gpu_ms),
            charged=Greatest(F("charged"), finish.charged),
            checkpoint_ref=finish.checkpoint or F("checkpoint_ref"),
        )
        if not done:
            raise Fenced(f"attempt {attempt.pk} was taken away before it finished")
        GpuAssignment.objects.filter(attempt=attempt, released_at__isnull=True).update(
            released_at=Now()
        )
        attempt.refresh_from_db()
        job = _move_job_on(job, attempt, finish, actor=actor)
        wake_dispatcher()
    return job


def _move_job_on(job: Job, attempt: Attempt, finish: Finish, *, actor: str) -> Job:
    """The job's next status after this attempt ended (inside finish_attempt's transaction)."""
    if job.status in TERMINAL_STATUSES:
        # Cancelled (or failed by an operator) while it ran: the status is final already.
        return job
    ec = finish.exit_class
    data = {"attempt": attempt.number, "exit_class": ec, "exit_code": finish.exit_code}
    if finish.resumed_step is not None:
        data["resumed_step"] = finish.resumed_step
    checkpoint = {"checkpoint_ref": finish.checkpoint} if finish.checkpoint else {}
    move = partial(transition_after_attempt, job, attempt, actor=actor, data=data)
    if ec == ExitClass.SUCCEEDED:
        changes = {"progress": 1.0, "result_path": finish.result_path}
        return move(to=JobStatus.SUCCEEDED, reason="the generator succeeded", changes=changes)
    if ec == ExitClass.KILLED or job.cancel_requested:
        return move(to=JobStatus.CANCELLED, reason="cancelled while running")
    if ec == ExitClass.PREEMPTED:
        meter_attempt_usage(job, attempt)
        changes = {"not_before": None, **checkpoint}
        if job.status == JobStatus.PREEMPTING:
            changes["preemption_count"] = F("preemption_count") + 1
            reason = "preempted; resumes from its checkpoint"
        else:  # its worker was shutting down: hand the job back without holding it up
            reason = "its worker shut down; resumes from its checkpoint on another"
        return move(to=JobStatus.QUEUED, reason=reason, changes=changes)
    if ec == ExitClass.TIMED_OUT:
        changes = {"error_code": "timed_out", "error_message": finish.error_message}
        return move(to=JobStatus.TIMED_OUT, reason=finish.error_message, changes=changes)
    return requeue_or_fail(
        job, attempt, reason=finish.error_message, actor=actor, data=data, changes=checkpoint
    )


def requeue_or_fail(
    job: Job, attempt: Attempt, *, reason: str, actor: str, data: dict, changes: dict
) -> Job:
    """After a failed attempt: back to the queue with backoff while tries remain, else failed.

    Retryable exits (crash, OOM up to GANTRY_OOM_RETRIES, hang, node fault, lost lease)
    retry while the job's failed attempts are fewer than job.max_attempts and its params
    are not quarantined; the rest fail with error_code = the exit class ("dead_letter"
    for a lost one). The attempt's usage stays charged either way. Call inside a
    transaction holding the job row, after the attempt row is finished.
    """
    ec = attempt.exit_class
    failures = job.attempts.filter(exit_class__in=FAILURE_CLASSES).count()
    poisoned = quarantine.quarantine_if_poisonous(job) if ec in POISON_CLASSES else None
    retry = ec in RETRYABLE_CLASSES and failures < job.max_attempts and poisoned is None
    if ec == ExitClass.OOM:
        ooms = job.attempts.filter(exit_class=ExitClass.OOM).count()
        retry = retry and ooms <= settings.GANTRY_OOM_RETRIES
    data = {**data, "failures": failures}
    code = "dead_letter" if ec == ExitClass.LOST else ec
    metrics.count_retry_decision(exit_class=ec, retried=retry, error_code=code)
    if retry:
        backoff = retry_backoff_s(failures)
        meter_attempt_usage(job, attempt)
        return transition_after_attempt(
            job,
            attempt,
            to=JobStatus.QUEUED,
            reason=f"{reason} Retrying in {backoff:g} s "
            f"(failure {failures} of {job.max_attempts}).",
            actor=actor,
            data={**data, "backoff_s": backoff},
            changes={
                "not_before": Now() + timedelta(seconds=backoff),
                "error_code": "",
                "error_message": "",
                **changes,
            },
        )
    message = reason
    if poisoned is not None:
        message += (
            f" Its params are quarantined: they hung or crashed on {poisoned.node_count} nodes."
        )
    elif ec in RETRYABLE_CLASSES:
        message += f" Gave up after {failures} failed attempts."
    return transition_after_attempt(
        job,
        attempt,
        to=JobStatus.FAILED,
        reason=message,
        actor=actor,
        data=data,
        changes={"error_code": code, "error_message": message, **changes},
    )


def transition_after_attempt(
    job: Job,
    attempt: Attempt,
    *,
    to: str,
    reason: str,
    actor: str,
    data: dict,
    changes: dict | None = None,
) -> Job:
    """lifecycle.transition for the job of an attempt that just ended (this attempt's
    usage is the final one the ledger gets on a terminal status)."""
    return lifecycle.transition(
        job.pk,
        to=to,
        reason=reason or to,
        actor=actor,
        only_from=[JobStatus.RUNNING, JobStatus.PREEMPTING, JobStatus.SCHEDULED],
        attempt=attempt,
        changes=changes,
        data=data,
    )


def meter_attempt_usage(job: Job, attempt: Attempt) -> None:
    """Make the attempt's final usage durable in the ledger while the hold stays open."""
    if job.hold_id is None or attempt.charged <= 0:
        return
    from apps.ledger import services as ledger

    ledger.meter(
        job.hold, cumulative_usage=attempt.charged, seq=FINAL_SEQ, attempt_key=str(attempt.pk)
    )


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
    """The generator subprocess in its own session; stdout lines read by a thread."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict, stderr_path: Path):
        self._stderr = open(stderr_path, "wb")  # noqa: SIM115 (closed in wait())
        self.lines: queue.Queue = queue.Queue()
        try:
            self.proc = subprocess.Popen(
                _with_parent_death_signal(argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,  # its own process group: killpg reaches its children
            )
        except OSError:
            self._stderr.close()
            raise
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for raw in self.proc.stdout:
            self.lines.put((time.monotonic(), raw.decode("utf-8", "replace").strip()))
        self.lines.put(None)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def wait(self) -> int:
        returncode = self.proc.wait()
        self.signal(signal.SIGKILL)  # anything it left behind in its group
        self._reader.join(timeout=2)
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
        attempt = claim_attempt(attempt_id, fencing_token, worker=worker)
        if attempt is None:
            return RunOutcome(str(attempt_id), claimed=False)
        run = _Run(attempt, worker=worker)
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

    def __init__(self, attempt: Attempt, *, worker: str):
        self.attempt = attempt
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

    # -- accounting ---------------------------------------------------------------------

    def gpu_ms(self, now: float) -> int:
        # Never bill past the runtime the job has left (the kill lands a poll later).
        return min(int((now - self.started) * 1000), self.budget_ms) * self.gpu_count

    def charge(self, gpu_ms: int) -> int:
        return usage_micro_credits(
            gpu_ms=gpu_ms, price_per_gpu_hour=self.attempt.price_per_gpu_hour
        )

    # -- the run ------------------------------------------------------------------------

    def execute(self) -> RunOutcome:
        try:
            gen = self._start()
        except OSError as exc:  # the node cannot run it (disk, binary): another node may
            logger.exception("attempt %s: the generator did not start", self.attempt.pk)
            return self._finish(
                Finish(ExitClass.NODE_FAULT, None, 0, 0, f"The generator did not start: {exc}")
            )
        try:
            return self._supervise(gen)
        finally:
            if gen.proc.poll() is None:  # an error in here must not leave it running
                gen.signal(signal.SIGKILL)
                gen.wait()

    def _start(self) -> _Generator:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        checkpoints = checkpoint_dir(self.job.pk)
        checkpoints.mkdir(parents=True, exist_ok=True)
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
        return _Generator(argv, cwd=self.scratch, env=env, stderr_path=self.scratch / "stderr.log")

    def _supervise(self, gen: _Generator) -> RunOutcome:
        last_output = self.started
        next_beat = self.started + settings.GANTRY_HEARTBEAT_S
        kill_at: float | None = None
        while True:
            for at, line in self._drain_lines(gen, timeout=POLL_S):
                last_output = at
                self.out.parse(line)
            now = time.monotonic()
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
            if now >= next_beat:
                next_beat = now + settings.GANTRY_HEARTBEAT_S
                job_signal = self._heartbeat(now)
                if job_signal is None:
                    gen.signal(signal.SIGKILL)
                    gen.wait()
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
        return self._finish(self._outcome(returncode, ended))

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
            HEARTBEATS.labels("error").inc()
            # Keep running: the next heartbeat may get through before the lease runs out,
            # and if it does not, the reaper requeues the job and this run is fenced.
            logger.warning("attempt %s: heartbeat failed: %s", self.attempt.pk, exc)
            close_old_connections()
            return False
        out.progress_unsent = out.checkpoint_unsent = out.resumed_unsent = False
        HEARTBEATS.labels("ok" if job_signal is not None else "fenced").inc()
        if job_signal is not None:
            renewed = time.monotonic()
            metrics.HEARTBEAT_LAG.labels(node=self.node).observe(renewed - self.renewed)
            self.renewed = renewed
        return job_signal

    def _outcome(self, returncode: int, ended: float) -> Finish:
        gpu_ms = self.gpu_ms(ended)
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

    def _finish(self, finish: Finish) -> RunOutcome:
        attempt = self.attempt
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
        ATTEMPTS.labels(finish.exit_class).inc()
        GPU_SECONDS.inc(finish.gpu_ms / 1000)
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
    "Fenced",
    "Finish",
    "JobSignal",
    "RunOutcome",
    "claim_attempt",
    "classify_exit",
    "finish_attempt",
    "generator_command",
    "heartbeat",
    "meter_attempt_usage",
    "nodes_to_avoid",
    "request_drain",
    "requeue_or_fail",
    "retry_backoff_s",
    "run_attempt",
    "transition_after_attempt",
    "usage_micro_credits",
]
