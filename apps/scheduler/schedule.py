"""Periodic tasks of the scheduler (merged into the beat schedule by config.celery).

Each entry expires about when the next one is due, so a backlog after an outage does
not run a pile of stale ticks; overlapping ticks are harmless (advisory lock).
"""

from django.conf import settings

_TICK = float(settings.GANTRY_DISPATCH_INTERVAL_S)
_RECOVERY = float(settings.GANTRY_RECOVERY_INTERVAL_S)

BEAT_SCHEDULE = {
    "scheduler-dispatch-tick": {
        "task": "gantry.scheduler.dispatch_tick",
        "schedule": _TICK,
        "options": {"queue": "control", "expires": max(1.0, 2 * _TICK)},
    },
    "scheduler-recover-unclaimed-attempts": {
        "task": "gantry.scheduler.recover_unclaimed_attempts",
        "schedule": _RECOVERY,
        "options": {"queue": "control", "expires": _RECOVERY},
    },
    "scheduler-prune-dispatch-decisions": {
        "task": "gantry.scheduler.prune_dispatch_decisions",
        "schedule": 3600.0,
        "options": {"queue": "control", "expires": 1800},
    },
}
