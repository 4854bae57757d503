"""Periodic recovery tasks of the worker pools (merged into the beat schedule by config.celery).

Both are safe to overlap (row locks and guarded updates); each entry expires when the
next one is due, so a beat that was down does not replay a backlog of stale runs.
Lost run messages are the scheduler's (gantry.scheduler.recover_unclaimed_attempts),
expired buckets and holds the ledger's (ledger.expire_buckets, ledger.expire_stale_holds).
"""

from django.conf import settings

_RECOVERY = float(settings.GANTRY_RECOVERY_INTERVAL_S)

BEAT_SCHEDULE = {
    "jobs-reap-expired-leases": {
        "task": "gantry.jobs.reap_expired_leases",
        "schedule": _RECOVERY,
        "options": {"queue": "control", "expires": _RECOVERY},
    },
    "jobs-close-stranded-holds": {
        "task": "gantry.jobs.close_stranded_holds",
        "schedule": 60.0,
        "options": {"queue": "control", "expires": 60.0},
    },
}
