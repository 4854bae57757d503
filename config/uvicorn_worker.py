"""gunicorn's worker class for the API: uvicorn's, without uvicorn's own access log (the
ASGI application writes one line per request with its request id, apps/core/access_log.py),
and one that does not outlive its master.

gunicorn's own sync and gthread workers shut down when their parent changes; uvicorn's
does not. A master killed with SIGKILL (the OOM killer, `kill -9`, a crashed host agent)
left its three workers serving the inherited socket unsupervised, while the supervisor's
new master failed to bind the port ("Address already in use") every few seconds, for as
long as the orphans lived: measured under `make up`, 11 minutes and counting. Now the
kernel sends each worker SIGTERM when its master dies (Linux's parent-death signal) and
it shuts down gracefully, finishing its requests; elsewhere the worker notices the new
parent at its next heartbeat to the master.
"""

from __future__ import annotations

import os
import signal
import sys

from uvicorn_worker import UvicornWorker

from apps.core.process import signal_on_parent_death


class GantryUvicornWorker(UvicornWorker):
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "access_log": False}

    def init_process(self) -> None:
        signal_on_parent_death(signal.SIGTERM)
        if os.getppid() != self.ppid:  # the master died before the signal was arranged
            sys.exit(0)
        super().init_process()

    async def callback_notify(self) -> None:
        if os.getppid() != self.ppid:  # where there is no parent-death signal
            self.log.info("Parent changed, shutting down: %s", self)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        await super().callback_notify()
