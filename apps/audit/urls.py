from django.urls import path

from apps.audit.views import AuditTrailView

urlpatterns = [path("audit", AuditTrailView.as_view(), name="audit")]
