import logging.config
import os

from celery import Celery
from celery.signals import (
    before_task_publish,
    setup_logging,
    task_postrun,
    task_prerun,
    worker_process_shutdown,
    worker_ready,
)

from apps.core import logging as gantry_logging
from apps.core import metrics

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Before any task module creates a metric (prometheus_client writes there at once).
metrics.ensure_multiprocess_dir()

app = Celery("gantry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The GPU worker pools' tasks (run, heartbeat-driven recovery) live beside the jobs app.
app.autodiscover_tasks(["apps.jobs"], related_name="worker_tasks")

# The periodic tasks are settings.CELERY_BEAT_SCHEDULE (read with the CELERY namespace).


# --- Logs: JSON lines, with the request id carried from the API into the tasks ---------

# Message header carrying the X-Request-Id of the request that published a task.
REQUEST_ID_HEADER = "request_id"


@setup_logging.connect
def configure_json_logging(loglevel=None, **kwargs):
    """Workers and beat log like the API (settings.LOGGING), not in Celery's format."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger().setLevel(loglevel)


@before_task_publish.connect
def add_request_id_header(headers=None, **kwargs):
    request_id = gantry_logging.current_request_id()
    if request_id and headers is not None:
        headers.setdefault(REQUEST_ID_HEADER, request_id)


@task_prerun.connect
def bind_task_log_context(task_id=None, task=None, **kwargs):
    request = getattr(task, "request", None)
    request_id = getattr(request, REQUEST_ID_HEADER, None) or (
        (getattr(request, "headers", None) or {}).get(REQUEST_ID_HEADER)
    )
    gantry_logging.bind_task(name=getattr(task, "name", ""), task_id=task_id, request_id=request_id)


@task_postrun.connect
def unbind_task_log_context(**kwargs):
    gantry_logging.unbind_task()


# --- Metrics: each worker serves its own /metrics --------------------------------------


@worker_ready.connect
def serve_worker_metrics(**kwargs):
    """/metrics of this worker (and its pool children) on GANTRY_METRICS_PORT, if set."""
    metrics.start_metrics_server_from_env()


@worker_ready.connect
def pulse_for_served_nodes(sender=None, **kwargs):
    """A GPU-pool worker says, for each node whose queue it consumes, that it is alive
    (and what its GPUs report): the admin's fleet page shows it (apps/fleet/liveness.py)."""
    from apps.fleet.liveness import start_pulsing

    consumer = getattr(sender, "task_consumer", None)
    queues = [queue.name for queue in getattr(consumer, "queues", None) or []]
    nodes = [name.removeprefix("node.") for name in queues if name.startswith("node.")]
    start_pulsing(nodes, worker=getattr(sender, "hostname", "") or "")


@worker_process_shutdown.connect
def forget_pool_child(pid=None, **kwargs):
    """A prefork child exits: its live gauges must not be reported any more."""
    metrics.mark_process_dead(pid or os.getpid())
