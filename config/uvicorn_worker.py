"""gunicorn's worker class for the API: uvicorn's, without uvicorn's own access log (the
ASGI application writes one line per request with its request id, apps/core/access_log.py)."""

from uvicorn_worker import UvicornWorker


class GantryUvicornWorker(UvicornWorker):
    CONFIG_KWARGS = {**UvicornWorker.CONFIG_KWARGS, "access_log": False}
