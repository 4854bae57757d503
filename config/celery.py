import importlib
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("gantry")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# The GPU worker pools' tasks (run, heartbeat-driven recovery) live beside the jobs app.
app.autodiscover_tasks(["apps.jobs"], related_name="worker_tasks")

# Each app declares its periodic tasks in apps/<app>/schedule.py (BEAT_SCHEDULE).
SCHEDULED_APPS = ("apps.ledger", "apps.jobs", "apps.scheduler")


@app.on_after_finalize.connect
def install_beat_schedule(sender, **kwargs):
    schedule = {}
    for package in SCHEDULED_APPS:
        try:
            module = importlib.import_module(f"{package}.schedule")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.schedule":
                raise
            continue
        schedule.update(module.BEAT_SCHEDULE)
    sender.conf.beat_schedule = schedule
