from django.urls import path

from apps.scheduler.audit_api import AuditTrailView

urlpatterns = [path("audit", AuditTrailView.as_view(), name="audit")]
