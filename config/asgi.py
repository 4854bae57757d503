"""The API's ASGI application: one port, two ways of serving.

Streams (`/v1/jobs/{id}/stream`, and `/v1/jobs/{id}/logs` followed as events) go to
Django's async handler: an open stream is a coroutine, not a thread, so a thousand
listeners cost a thousand small tasks. Everything else goes to the WSGI application in
a fixed pool of threads, as under gunicorn's gthread workers: Django's own ASGI path for
sync views hands each request to a new thread and a new database connection, which
measured 68 submissions/s with 503s against 338/s (bench/api.py, 2 cores), while this
split measured 345/s at the same CPU per submission (docs/decisions.md). The pool is fed
by `BufferedWSGI`, one hand-off per request (a2wsgi's streaming hand-offs cost about
0.4 ms of CPU a request: docs/performance.md).
"""

import os
import re

from django.conf import settings
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application

from apps.core.access_log import AccessLog
from apps.core.wsgi_bridge import BufferedWSGI

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

_streams = get_asgi_application()
_requests = BufferedWSGI(
    get_wsgi_application(),
    threads=int(os.environ.get("GANTRY_API_THREADS", "4")),
    max_body=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
)
STREAM_PATHS = re.compile(r"^/v1/jobs/[^/]+/(stream|logs)/?$")


async def _route(scope, receive, send):
    if scope["type"] == "http" and not STREAM_PATHS.match(scope.get("path", "")):
        return await _requests(scope, receive, send)
    return await _streams(scope, receive, send)


application = AccessLog(_route)
