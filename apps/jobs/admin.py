"""Operator views of jobs: search and filter, the event log and attempts inline, and the
cancel / requeue / clear-quarantine actions (which call the same services as the API).
Every action is recorded as an operator action (the audit trail)."""

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from apps.accounts.operator_actions import operator_of
from apps.core.admin import ReadOnlyInline
from apps.core.errors import GantryError
from apps.jobs import operations
from apps.jobs.models import Attempt, Job, JobEvent, QuarantinedFingerprint


class JobEventInline(ReadOnlyInline):
    model = JobEvent
    fields = ("at", "from_status", "to_status", "reason", "actor", "attempt", "data")
    readonly_fields = fields
    ordering = ("at", "id")


class AttemptInline(ReadOnlyInline):
    model = Attempt
    fields = (
        "number",
        "state",
        "node",
        "gpu_type",
        "devices",
        "price_per_gpu_hour",
        "exit_class",
        "exit_code",
        "gpu_ms",
        "charged",
        "lease_expires_at",
        "started_at",
        "finished_at",
    )
    readonly_fields = fields
    ordering = ("number",)


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "status",
        "tier",
        "org",
        "project",
        "gpu_count",
        "gpu_type",
        "progress",
        "attempt_count",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "tier", "org", "cancel_requested")
    search_fields = ("id", "org__name", "project__name", "fingerprint", "idempotency_key")
    list_select_related = ("org", "project")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    inlines = (AttemptInline, JobEventInline)
    actions = ("cancel_jobs", "requeue_dead_lettered")
    readonly_fields = [*(f.name for f in Job._meta.fields), "audit"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # a job's history is kept; cancel it instead

    @admin.display(description="audit trail")
    def audit(self, obj):
        return format_html(
            '<a href="{}?job={}">Every decision about this job</a>',
            reverse("admin:audit_trail"),
            obj.pk,
        )

    @admin.action(description="Cancel the selected jobs")
    def cancel_jobs(self, request, queryset):
        self._each(request, queryset, operations.cancel, verb="cancelled (or asked to stop)")

    @admin.action(description="Requeue the selected dead-lettered (failed) jobs as new jobs")
    def requeue_dead_lettered(self, request, queryset):
        self._each(request, queryset, operations.requeue, verb="requeued")

    def _each(self, request, queryset, operation, *, verb: str) -> None:
        """Run a recorded job operation on each selected job; report what it refused."""
        done, failed = 0, []
        for job_id, org_id, status in queryset.values_list("id", "org_id", "status"):
            try:
                operation(
                    job_id,
                    actor=operator_of(request),
                    event_actor=operator_of(request),
                    org_id=org_id,
                    status=status,
                )
                done += 1
            except GantryError as exc:
                failed.append(f"{job_id}: {exc.message}")
        self._report(request, done, failed, verb=verb)

    def _report(self, request, done: int, failed: list[str], *, verb: str) -> None:
        if done:
            self.message_user(request, f"{done} job(s) {verb}.", messages.SUCCESS)
        for line in failed:
            self.message_user(request, line, messages.ERROR)


@admin.register(QuarantinedFingerprint)
class QuarantinedFingerprintAdmin(admin.ModelAdmin):
    """Clearing (or deleting) a row lifts the quarantine: the fingerprint may be submitted
    again. Both go through clear_quarantine and are recorded."""

    list_display = ("fingerprint", "reason", "node_count", "sample_job", "created_at")
    search_fields = ("fingerprint", "reason")
    readonly_fields = ("fingerprint", "reason", "node_count", "sample_job", "created_at")
    ordering = ("-created_at",)
    actions = ("clear_quarantines",)

    def has_add_permission(self, request):
        return False

    @admin.action(description="Clear the selected quarantines (allow these params again)")
    def clear_quarantines(self, request, queryset):
        cleared = self._clear(request, queryset)
        self.message_user(request, f"Cleared {cleared} quarantine(s).", messages.SUCCESS)

    def delete_model(self, request, obj):
        self._clear(request, [obj])

    def delete_queryset(self, request, queryset):
        self._clear(request, queryset)

    def _clear(self, request, rows) -> int:
        actor = operator_of(request)
        return sum(operations.clear_quarantine(row, actor=actor) for row in list(rows))
