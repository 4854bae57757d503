"""Gunicorn settings of the API: Prometheus across worker processes, JSON logs.

    gunicorn config.asgi:application -c config/gunicorn.py --bind 127.0.0.1:8000 --workers 3

Every worker process writes its metric samples to PROMETHEUS_MULTIPROC_DIR and /metrics
adds them up (apps/core/metrics.py), so a scrape that lands on any worker sees the whole
API. Without the variable a directory under the system temp folder is used: several
processes can never be right with per-process metrics.
"""

import gc
import os
import tempfile

from apps.core import metrics

# Set before the workers start (and before a --preload'ed app is imported): they inherit it.
os.environ.setdefault(
    metrics.MULTIPROC_ENV,
    os.path.join(tempfile.gettempdir(), f"gantry-api-metrics-{os.getpid()}"),
)


def on_starting(server):
    """Once per master start (not on a HUP reload, whose old workers' counts still count)."""
    metrics.prepare_multiprocess_dir(os.environ[metrics.MULTIPROC_ENV])


def post_worker_init(worker):
    """The worker has loaded the application: move what start-up made (Django, the
    apps, the URL and schema machinery, most of the process's objects) out of the
    cyclic garbage collector's sight. A full pass of the collector rescans every
    tracked object and stalls every request of the worker meanwhile: in-process, 2,000
    submissions ran one full pass of 98 ms over 161,590 objects; frozen, full passes
    took at most 7.6 ms over 24,718 (docs/performance.md)."""
    gc.freeze()


def child_exit(server, worker):
    """A worker exited: drop its live gauges; its counters and histograms stay summed."""
    metrics.mark_process_dead(worker.pid)


# uvicorn workers running config.asgi: job streams as coroutines, every other request on
# the WSGI app in a pool of GANTRY_API_THREADS threads (4), as gthread workers did (the
# same CPU per submission, bench/api.py; docs/decisions.md). Sync workers (a connection
# each) cost about 40 % more CPU and served half the /healthz rate.
worker_class = "config.uvicorn_worker.GantryUvicornWorker"
# A URL over 8 KiB is answered by apps.core.middleware.RequestGuardMiddleware with a JSON
# 414; a proxy in front of the API (nginx: large_client_header_buffers) bounds what arrives.
limit_request_line = 0

# One JSON object a line, like the rest of the platform (access lines: apps/core/access_log.py).
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "apps.core.logging.JsonFormatter"},
        "text": {"()": "apps.core.logging.TextFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": os.environ.get("GANTRY_LOG_FORMAT", "json"),
        },
    },
    "root": {"level": "INFO", "handlers": ["console"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["console"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["console"], "propagate": False},
        "uvicorn.error": {"level": "INFO", "handlers": ["console"], "propagate": False},
        # Access lines come from apps.core.access_log (gantry.access), with the request id;
        # config/uvicorn_worker.py turns uvicorn's own off.
        "gantry.access": {"level": "INFO", "handlers": ["console"], "propagate": False},
    },
}
