"""Operator views of jobs: search and filter, the event log and attempts inline, and the
cancel / requeue / clear-quarantine actions (which call the same services as the API).
Every action is recorded as an operator action (the audit trail)."""

import uuid
from datetime import timedelta

from django.contrib import admin, messages
from django.db.models import BigIntegerField, Count, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from apps.accounts.admin import OrgFilter
from apps.accounts.models import Org, Project
from apps.accounts.operator_actions import operator_of
from apps.core.admin import ReadOnlyInline
from apps.core.errors import GantryError
from apps.core.money import credits
from apps.jobs import operations, queue_state
from apps.jobs.models import Attempt, Job, JobEvent, JobStatus, QuarantinedFingerprint
from apps.ledger.admin import LedgerOrgAdmin
from apps.ledger.models import Bucket


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
        "node",
        "progress",
        "attempt_count",
        "cost_credits",
        "exit_class",
        "error",
        "created_at",
        "finished_at",
    )
    # Every part of this page is read through an index, so that it opens as fast with
    # millions of jobs and tens of thousands of orgs: the newest first (job_recent), the
    # org filter listing only the org chosen, dates as ranges (no date hierarchy: it
    # reads every row's date), no count of the whole table, search by exact ids (below).
    list_filter = (
        "status",
        "tier",
        OrgFilter,
        "cancel_requested",
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("id", "org__name", "project__name", "fingerprint")  # the box; see below
    search_help_text = (
        "A job, hold, org or project id; an org or project name, or part of one; a fingerprint."
    )
    list_select_related = ("org", "project__org")
    show_full_result_count = False
    ordering = ("-created_at", "-id")
    inlines = (AttemptInline, JobEventInline)
    actions = ("cancel_jobs", "requeue_dead_lettered")
    readonly_fields = [*(f.name for f in Job._meta.fields), "queue", "audit"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # a job's history is kept; cancel it instead

    def get_queryset(self, request):
        latest = Attempt.objects.filter(job=OuterRef("pk")).order_by("-number")
        return (
            super()
            .get_queryset(request)
            .annotate(
                latest_node=Subquery(latest.values("node__name")[:1]),
                latest_exit=Subquery(latest.values("exit_class")[:1]),
                charged=Coalesce(Subquery(_charged_of_job()), 0),
            )
        )

    def get_search_results(self, request, queryset, search_term):
        """The jobs that an id names (the job, its hold, org or project), or whose org or
        project name contains the text, or with that fingerprint: each through an index
        (a text match on every job's columns would read the whole table)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            named = uuid.UUID(term)
        except ValueError:
            orgs = list(Org.objects.filter(name__icontains=term).values_list("pk", flat=True))
            projects = Project.objects.filter(name__icontains=term).values_list("pk", flat=True)
            match = Q(org_id__in=orgs) | Q(project_id__in=list(projects)) | Q(fingerprint=term)
        else:
            match = Q(pk=named) | Q(hold_id=named) | Q(org_id=named) | Q(project_id=named)
        return queryset.filter(match), False

    @admin.display(description="node", ordering="latest_node")
    def node(self, obj):
        return obj.latest_node or "-"

    @admin.display(description="cost (credits)", ordering="charged")
    def cost_credits(self, obj):
        return credits(obj.charged)

    @admin.display(description="last exit", ordering="latest_exit")
    def exit_class(self, obj):
        return obj.latest_exit or "-"

    @admin.display(description="error", ordering="error_code")
    def error(self, obj):
        if not obj.error_code:
            return "-"
        return format_html('<span title="{}">{}</span>', obj.error_message, obj.error_code)

    @admin.display(description="queue")
    def queue(self, obj):
        """Where a queued job stands, as the last dispatch tick saw it: its position, the
        whole reason it waits (the operators' wording) and its expected start."""
        if obj.status != JobStatus.QUEUED:
            return "-"
        state = queue_state.read_for([obj]).get(str(obj.pk), queue_state.UNKNOWN)
        start = state.estimated_start_at
        return format_html(
            "position {} · {} · expected to start {}",
            state.position if state.position is not None else "unknown",
            state.detail or state.reason,
            start.strftime("%Y-%m-%d %H:%M:%S UTC") if start else "unknown",
        )

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


class OrgOverviewAdmin(LedgerOrgAdmin):
    """The org list answers "who is spending what": what each org can spend now, what
    it spent over 24 hours and 30 days, its GPU-hours over 30 days, and its running and
    queued jobs; every column sortable (database annotations, one query per page)."""

    list_display = (
        "name",
        "tier",
        "weight",
        "available_credits",
        "spent_24h",
        "spent_30d",
        "gpu_hours_30d",
        "running_jobs",
        "queued_jobs",
        "created_at",
    )

    def get_queryset(self, request):
        now = timezone.now()
        live = Bucket.objects.filter(org=OuterRef("pk"), expired_at__isnull=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        )
        # Attempts still running, or that ended within the window, count in full: read
        # through attempt_org_ended, so an org's row costs its recent attempts, not its
        # history.
        attempts = Attempt.objects.filter(org=OuterRef("pk"))

        def attempts_since(delta, field):
            recent = attempts.filter(Q(finished_at__isnull=True) | Q(finished_at__gte=now - delta))
            return _sum_per_org(recent, "org", field)

        def jobs(status):
            counted = Job.objects.filter(org=OuterRef("pk"), status=status).values("org")
            return Coalesce(Subquery(counted.annotate(n=Count("pk")).values("n")), 0)

        return (
            super()
            .get_queryset(request)
            .annotate(
                available=_sum_per_org(live, "org", F("granted") - F("consumed") - F("held")),
                spent_day=attempts_since(timedelta(hours=24), F("charged")),
                spent_month=attempts_since(timedelta(days=30), F("charged")),
                gpu_ms_month=attempts_since(timedelta(days=30), F("gpu_ms")),
                running=jobs(JobStatus.RUNNING),
                queued=jobs(JobStatus.QUEUED),
            )
        )

    @admin.display(description="available (credits)", ordering="available")
    def available_credits(self, obj):
        return credits(obj.available)

    @admin.display(description="spent 24 h (credits)", ordering="spent_day")
    def spent_24h(self, obj):
        return credits(obj.spent_day)

    @admin.display(description="spent 30 d (credits)", ordering="spent_month")
    def spent_30d(self, obj):
        return credits(obj.spent_month)

    @admin.display(description="GPU-hours 30 d", ordering="gpu_ms_month")
    def gpu_hours_30d(self, obj):
        return f"{obj.gpu_ms_month / 3_600_000:.2f}"

    @admin.display(description="running", ordering="running")
    def running_jobs(self, obj):
        return _jobs_link(obj, JobStatus.RUNNING, obj.running)

    @admin.display(description="queued", ordering="queued")
    def queued_jobs(self, obj):
        return _jobs_link(obj, JobStatus.QUEUED, obj.queued)


def _charged_of_job():
    """What the job's attempts were charged so far (micro-credits), as a subquery."""
    # No ordering: an attempt's (by job) would join each summed row to its job.
    attempts = Attempt.objects.filter(job=OuterRef("pk")).order_by().values("job")
    return attempts.annotate(total=Sum("charged")).values("total")


def _sum_per_org(queryset, org_path: str, expression):
    # No ordering: an attempt's (by job) would join every summed row to its job.
    summed = queryset.order_by().values(org_path).annotate(total=Sum(expression)).values("total")
    return Coalesce(Subquery(summed, output_field=BigIntegerField()), 0)


def _jobs_link(org, status: str, count: int):
    url = reverse("admin:jobs_job_changelist")
    return format_html(
        '<a href="{}?org__id__exact={}&status__exact={}">{}</a>', url, org.pk, status, count
    )


# The ledger's org page, with the jobs' figures in its list (the layer above adds them).
admin.site.unregister(Org)
admin.site.register(Org, OrgOverviewAdmin)
