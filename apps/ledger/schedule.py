"""Periodic ledger tasks, installed into Celery beat by config/celery.py.

Each entry expires about when the next one is due, so a backlog after an outage does
not run a pile of stale copies; the tasks are safe to overlap anyway.
"""

BEAT_SCHEDULE = {
    "ledger-fold-usage-reports": {
        "task": "ledger.fold_usage_reports",
        "schedule": 1.0,
        "options": {"expires": 2.0},
    },
    "ledger-expire-buckets": {
        "task": "ledger.expire_buckets",
        "schedule": 15.0,
        "options": {"expires": 15.0},
    },
    "ledger-expire-stale-holds": {
        "task": "ledger.expire_stale_holds",
        "schedule": 15.0,
        "options": {"expires": 15.0},
    },
    "ledger-reconcile": {
        "task": "ledger.reconcile",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
}
