"""Prometheus exposition for every Gantry process, right under several processes.

Series are defined next to the code that moves them (apps/ledger/metrics.py,
apps/scheduler/services/metrics.py, apps/jobs/metrics.py, the runner); docs/operations.md
lists them all. This module only decides how a process exposes them:

- gunicorn runs several API processes behind one port, so a scrape reaches one of them
  at random. With PROMETHEUS_MULTIPROC_DIR set (the launcher and config/gunicorn.py do),
  every process writes its samples to files there and /metrics adds them all up;
  gunicorn's child_exit hook marks a dead process so its live gauges drop out.
- Each Celery worker serves its own /metrics on GANTRY_METRICS_PORT (config.celery
  starts the server when the worker is ready). A thread-pool worker (a GPU node's pool)
  is one process and needs nothing more; a prefork worker (the control worker) needs its
  own PROMETHEUS_MULTIPROC_DIR, emptied before it starts, so the parent's server adds
  up its pool children. (The directory cannot be emptied from inside the worker: metric
  files are opened while Celery loads the app.)

Multiprocess gauges declare how processes combine (multiprocess_mode): "livemostrecent"
for values a periodic task sets (the latest writer among live processes wins),
"livemax" for reconciler findings, "max" for timestamps.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
    start_http_server,
)

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
PORT_ENV = "GANTRY_METRICS_PORT"
ADDR_ENV = "GANTRY_METRICS_ADDR"


def multiprocess_dir() -> str | None:
    """The directory shared by this process group's samples, or None (single process)."""
    return os.environ.get(MULTIPROC_ENV) or None


def exposition_registry() -> CollectorRegistry:
    """The registry a scrape of this process reads: all processes of the group when a
    multiprocess directory is set, else this process's own (with process metrics)."""
    if multiprocess_dir() is None:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def render() -> tuple[bytes, str]:
    """(body, content type) of a scrape."""
    return generate_latest(exposition_registry()), CONTENT_TYPE_LATEST


def prepare_multiprocess_dir(path: str | os.PathLike) -> Path:
    """Empty (or create) a multiprocess directory before its process group starts.

    Samples left by an earlier run would be added to this run's: counters would not
    start from zero and dead processes' gauges would linger.
    """
    directory = Path(path)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def ensure_multiprocess_dir() -> None:
    """Create the multiprocess directory if it is set but missing (never empties it).

    prometheus_client writes there as soon as a metric is created; a missing directory
    would crash the process at import time.
    """
    directory = multiprocess_dir()
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)


def mark_process_dead(pid: int) -> None:
    """Drop a finished process's live gauges (its counters and histograms stay counted)."""
    if multiprocess_dir() is not None:
        multiprocess.mark_process_dead(pid)


def start_metrics_server(port: int, *, addr: str = "127.0.0.1"):
    """Serve /metrics of this process group on `port` from a daemon thread.

    Returns the server, or None if the port could not be bound (logged: a worker without
    metrics still runs its jobs).
    """
    try:
        server, _thread = start_http_server(port, addr=addr, registry=exposition_registry())
    except OSError as exc:
        logger.error("metrics server not started on %s:%s: %s", addr, port, exc)
        return None
    logger.info("metrics on http://%s:%s/metrics", addr, port)
    return server


def start_metrics_server_from_env():
    """start_metrics_server() on GANTRY_METRICS_PORT (and GANTRY_METRICS_ADDR), if set."""
    port = os.environ.get(PORT_ENV, "").strip()
    if not port:
        return None
    return start_metrics_server(int(port), addr=os.environ.get(ADDR_ENV) or "127.0.0.1")
