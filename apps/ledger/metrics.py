"""Prometheus series of the ledger (served by /metrics with the rest of the process)."""

from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from prometheus_client import Counter, Gauge, Histogram

OPERATIONS = Counter(
    "gantry_ledger_operations_total",
    "Ledger operations by kind and outcome (ok, replay, insufficient, budget, conflict, ...).",
    ["op", "outcome"],
)
MOVED = Counter(
    "gantry_ledger_microcredits_total",
    "Micro-credits moved by the ledger, by entry kind.",
    ["kind"],
)
BUDGET_ALERTS = Counter(
    "gantry_ledger_budget_alerts_total", "Reservations that took a soft budget over its limit."
)
USAGE_REPORTS = Counter(
    "gantry_ledger_usage_reports_total",
    "Usage reports on the batched path: recorded (in Redis), folded (into the ledger).",
    ["stage"],
)
FOLD_SECONDS = Histogram(
    "gantry_ledger_fold_seconds",
    "Duration of one fold of pending usage reports into the ledger.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
)
RECONCILE_VIOLATIONS = Gauge(
    "gantry_ledger_reconcile_violations",
    "Invariant violations found by the latest reconciliation, by check.",
    ["check"],
    multiprocess_mode="livemax",
)
RECONCILE_RUNS = Counter("gantry_ledger_reconcile_runs_total", "Reconciliations run.")
RECONCILE_LAST_RUN = Gauge(
    "gantry_ledger_reconcile_last_run_timestamp_seconds",
    "When the latest reconciliation finished (Unix time).",
    multiprocess_mode="max",
)


def after_commit(callback: Callable[[], None]) -> None:
    """Run `callback` once the caller's transaction commits (dropped if it rolls back);
    at once when there is none (a service's own transaction has committed by now)."""
    db = connections[DEFAULT_DB_ALIAS]
    if db.in_atomic_block:
        transaction.on_commit(callback, using=db.alias)
    else:
        callback()


def count(op: str, outcome: str = "ok") -> None:
    """Count an operation. "ok" counts what was written, so it is counted once the
    caller's transaction commits (see after_commit); a refusal or a replay is counted at
    once, whatever the caller's transaction does next."""
    counter = OPERATIONS.labels(op=op, outcome=outcome)
    if outcome == "ok":
        after_commit(counter.inc)
    else:
        counter.inc()


def count_budget_alerts(alerts: int) -> None:
    """Count soft-budget alerts written by a reservation, once they are committed."""
    if alerts:
        after_commit(lambda: BUDGET_ALERTS.inc(alerts))


def count_moved(legs) -> None:
    """Count the micro-credits moved by committed (kind, signed amount) legs."""
    totals: dict[str, int] = {}
    for kind, amount in legs:
        if amount > 0:
            totals[kind] = totals.get(kind, 0) + amount
    for kind, amount in totals.items():
        MOVED.labels(kind=kind).inc(amount)
