from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from apps.core import health

handler400 = "apps.core.errors.json_bad_request"
handler404 = "apps.core.errors.not_found"
handler500 = "apps.core.errors.json_server_error"

v1 = [
    # First: job submission is the hottest path, and Django tries the patterns in order.
    path("", include("apps.jobs.urls")),
    path(
        "schema/",
        SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
        name="schema",
    ),
    path(
        "docs/",
        SpectacularSwaggerView.as_view(
            url_name="schema", authentication_classes=[], permission_classes=[]
        ),
        name="docs",
    ),
    path(
        "redoc/",
        SpectacularRedocView.as_view(
            url_name="schema",
            template_name="gantry/redoc.html",  # without ReDoc's web fonts from Google
            authentication_classes=[],
            permission_classes=[],
        ),
        name="redoc",
    ),
    path("", include("apps.accounts.urls")),
    path("", include("apps.ledger.urls")),
    path("", include("apps.scheduler.urls")),
    path("", include("apps.audit.urls")),
]

urlpatterns = [
    path("v1/", include(v1)),
    path("healthz", health.healthz),
    path("readyz", health.readyz),
    path("metrics", health.metrics),
    # The fleet's models moved from the scheduler app to the fleet app: old bookmarks work.
    re_path(
        r"^admin/scheduler/(?P<rest>(node|gpu|gputype)/.*)$",
        RedirectView.as_view(url="/admin/fleet/%(rest)s", query_string=True, permanent=True),
    ),
    path("admin/", admin.site.urls),
]
