"""Gunicorn settings of the API: Prometheus across worker processes, JSON logs.

    gunicorn config.wsgi -c config/gunicorn.py --bind 127.0.0.1:8000 --workers 3

Every worker process writes its metric samples to PROMETHEUS_MULTIPROC_DIR and /metrics
adds them up (apps/core/metrics.py), so a scrape that lands on any worker sees the whole
API. Without the variable a directory under the system temp folder is used: several
processes can never be right with per-process metrics.
"""

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


def child_exit(server, worker):
    """A worker exited: drop its live gauges; its counters and histograms stay summed."""
    metrics.mark_process_dead(worker.pid)


# Threaded workers with keep-alive: per request, sync workers (a connection each) cost
# about 40 % more CPU here and served half the /healthz rate (bench/api.py, 2 cores);
# 4 threads a process let one thread run while the others wait on PostgreSQL or Redis.
worker_class = "gthread"
# No request-line limit here: apps.core.middleware.RequestGuardMiddleware answers a URL
# over 8 KiB with a JSON 414, where gunicorn's own limit (4 KiB) answers in plain text. A
# proxy in front of the API (nginx: large_client_header_buffers) bounds what arrives.
limit_request_line = 0
threads = 4

# One JSON object a line, like the rest of the platform; the access line names the
# request id the API answered with (X-Request-Id).
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms request_id=%({x-request-id}o)s agent="%(a)s"'
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "apps.core.logging.JsonFormatter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json"},
    },
    "root": {"level": "INFO", "handlers": ["console"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["console"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["console"], "propagate": False},
    },
}
