"""Liveness, readiness and Prometheus metrics endpoints (no auth: for probes and scrapers)."""

from django.db import connection
from django.http import HttpResponse, JsonResponse

from apps.core import metrics as exposition
from apps.core.redis import redis_client


def healthz(request):
    """The process is up and serving."""
    return JsonResponse({"status": "ok"})


def readyz(request):
    """PostgreSQL and Redis are reachable; 503 naming what is not."""
    checks = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"unreachable: {exc.__class__.__name__}"
    try:
        redis_client().ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unreachable: {exc.__class__.__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ready" if ready else "not ready", "checks": checks},
        status=200 if ready else 503,
    )


def metrics(request):
    """Prometheus exposition; adds up gunicorn's processes in multiprocess mode."""
    body, content_type = exposition.render()
    return HttpResponse(body, content_type=content_type)
