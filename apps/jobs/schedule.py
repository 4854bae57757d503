"""Periodic tasks of the jobs app (merged into the beat schedule by config.celery)."""

BEAT_SCHEDULE = {
    "jobs-redeliver-webhooks": {
        "task": "gantry.jobs.redeliver_webhooks",
        "schedule": 600.0,
        "options": {"queue": "control", "expires": 300},
    },
}
