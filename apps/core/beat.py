"""Celery beat as a singleton across control hosts: only the leader sends.

Every control host may run a beat; each asks `LeaderLock("gantry:beat").hold()` on every
wake-up and sends due periodic tasks only while it leads. A follower tries again every
second, so when the leader dies or is cut off, its session ends within
GANTRY_LOCK_IDLE_TIMEOUT_S (apps.core.locks) and a follower leads at most a second
later. A beat that comes back after a cut finds its session gone and follows. Every
periodic task is also safe to run twice at once (the module docstring of the schedule
in config/settings.py), so the moment of a handover costs at most a duplicate tick.
"""

from __future__ import annotations

import logging

from celery.beat import PersistentScheduler
from django.conf import settings

from apps.core import locks

logger = logging.getLogger(__name__)

BEAT_LOCK = "gantry:beat"
FOLLOWER_RETRY_S = 1.0


class LeaderScheduler(PersistentScheduler):
    """PersistentScheduler that sends only while this beat holds the beat's leader lock."""

    def __init__(self, *args, **kwargs):
        self.leader = locks.LeaderLock(BEAT_LOCK)
        self.leading: bool | None = None  # None: not asked yet (the first answer is logged)
        super().__init__(*args, **kwargs)

    def tick(self, *args, **kwargs) -> float:
        leading = self.leader.hold()
        if leading != self.leading or (not leading and self.leader.last_error):
            if leading:
                logger.warning("beat leads: sending the periodic tasks")
            else:
                logger.warning("beat follows: %s", self.leader.last_error or "another beat leads")
            self.leader.last_error = ""
            self.leading = leading
        if not leading:
            return FOLLOWER_RETRY_S
        # Wake up often enough that the leader's session never idles out.
        return min(super().tick(*args, **kwargs), settings.GANTRY_LOCK_IDLE_TIMEOUT_S / 3)

    def close(self) -> None:
        self.leader.release()
        super().close()
