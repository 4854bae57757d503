from django.urls import path

from apps.jobs import views

urlpatterns = [
    path("jobs", views.JobListView.as_view(), name="jobs"),
    path("jobs/<uuid:job_id>", views.JobDetailView.as_view(), name="job"),
    path("jobs/<uuid:job_id>/events", views.JobEventsView.as_view(), name="job-events"),
    path("jobs/<uuid:job_id>/cancel", views.JobCancelView.as_view(), name="job-cancel"),
    path("jobs/<uuid:job_id>/requeue", views.JobRequeueView.as_view(), name="job-requeue"),
    path("jobs/<uuid:job_id>/stream", views.job_stream, name="job-stream"),
    path("jobs/<uuid:job_id>/logs", views.job_logs, name="job-logs"),
    path("jobs/<uuid:job_id>/result", views.JobResultView.as_view(), name="job-result"),
    path("results/<str:token>", views.ResultDownloadView.as_view(), name="result-download"),
    path("generator/schema", views.GeneratorSchemaView.as_view(), name="generator-schema"),
    path("webhooks/secret", views.WebhookSecretView.as_view(), name="webhook-secret"),
    path("quarantine", views.QuarantineListView.as_view(), name="quarantine"),
    path(
        "quarantine/<str:fingerprint>",
        views.QuarantineDetailView.as_view(),
        name="quarantine-fingerprint",
    ),
]
