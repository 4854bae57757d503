"""Prometheus series of jobs: admission, start wait, retries and failures, heartbeats.

Served by /metrics of whichever process moves them (API for
admission; the node's worker for the rest; apps/core/metrics.py).
"""

from django.db import transaction
from prometheus_client import Counter, Histogram

# The runner's: attempts by exit class, heartbeats by outcome, GPU-seconds used.
ATTEMPTS = Counter(
    "gantry_runner_attempts_total", "Attempts run to their end, by exit class.", ["exit_class"]
)
HEARTBEATS = Counter(
    "gantry_runner_heartbeats_total", "Heartbeats by outcome (ok, fenced, error).", ["outcome"]
)
LEASES_LOST = Counter(
    "gantry_runner_leases_lost_total",
    "Runs that fenced themselves: no lease renewal accepted for GANTRY_LEASE_S (their host "
    "cut off from the database); the generator was killed and nothing written.",
)
GPU_SECONDS = Counter("gantry_runner_gpu_seconds_total", "GPU-seconds used by finished attempts.")
ADMISSION_REFUSALS = Counter(
    "gantry_admission_refusals_total",
    "Submissions refused with 429, by tier and reason (rate_limited: the org's or the "
    "tier's token bucket; overloaded: free tier shed; quota_exceeded: max queued jobs).",
    ["tier", "reason"],
)
START_WAIT = Histogram(
    "gantry_start_wait_seconds",
    "From a job (re)entering the queue to its attempt starting on a worker (database "
    "clock), by tier; a retry's backoff and a preempted job's second wait count too.",
    ["tier"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
)
RETRIES = Counter(
    "gantry_job_retries_total",
    "Failed attempts whose job went back to the queue for another try, by exit class.",
    ["exit_class"],
)
FAILURES = Counter(
    "gantry_job_failures_total",
    "Jobs failed for good after an attempt, by error code (the exit class, dead_letter "
    "for a lost lease).",
    ["error_code"],
)
HEARTBEAT_LAG = Histogram(
    "gantry_heartbeat_lag_seconds",
    "Time between an attempt's consecutive lease renewals (its start, then each "
    "heartbeat), observed as a heartbeat commits, by node: GANTRY_HEARTBEAT_S plus delays; "
    "past GANTRY_LEASE_S the attempt is lost.",
    ["node"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 2.5, 3, 4, 5, 7.5, 10, 15, 20, 30, 60),
)


def count_refusal(*, tier: str, reason: str) -> None:
    ADMISSION_REFUSALS.labels(tier=tier, reason=reason).inc()


def observe_start_wait(*, tier: str, queued_at, started_at) -> None:
    """Record one start; both times come from the database clock."""
    if queued_at is not None and started_at is not None:
        START_WAIT.labels(tier=tier).observe(max(0.0, (started_at - queued_at).total_seconds()))


def count_retry_decision(*, exit_class: str, retried: bool, error_code: str = "") -> None:
    """Count a retry or a final failure once the transaction that decided it commits."""
    if retried:
        transaction.on_commit(RETRIES.labels(exit_class=exit_class).inc)
    else:
        transaction.on_commit(FAILURES.labels(error_code=error_code or exit_class).inc)
