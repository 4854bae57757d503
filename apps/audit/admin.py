"""The audit trail page of the admin: every credit, scheduling and operator decision,
merged newest first, filterable by org, job, time and kind (apps.audit.selectors).

It hangs off the dispatch decisions' admin (/admin/scheduler/dispatchdecision/audit/),
which this app, above the scheduler, extends and registers again.
"""

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path

from apps.accounts.models import Org
from apps.audit.selectors import (
    EVERYTHING,
    KINDS,
    MAX_LIMIT,
    SOURCES,
    AuditCursor,
    AuditFilters,
    audit_page,
)
from apps.core.errors import GantryError
from apps.scheduler.admin import DispatchDecisionAdmin
from apps.scheduler.models import DispatchDecision


class AuditTrailAdmin(DispatchDecisionAdmin):
    def get_urls(self):
        audit = path("audit/", self.admin_site.admin_view(self.audit_view), name="audit_trail")
        return [audit, *super().get_urls()]

    def audit_view(self, request):
        """The merged audit trail (apps.audit.selectors), newest first, with filters."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = AuditFilterForm(request.GET)
        page, filters_query = None, ""
        if form.is_valid():
            data = form.cleaned_data
            filters = AuditFilters(
                org_id=data["org"].pk if data["org"] else None,
                job_id=data["job"],
                since=data["since"],
                until=data["until"],
                kinds=frozenset([data["kind"]]) if data["kind"] else frozenset(),
            )
            try:
                cursor = AuditCursor.decode(data["cursor"]) if data["cursor"] else None
                page = audit_page(filters=filters, cursor=cursor, limit=data["limit"] or 50)
            except GantryError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            query = request.GET.copy()
            query.pop("cursor", None)
            filters_query = query.urlencode()
        org_names = {}
        if page is not None:
            org_ids = {item.org_id for item in page.items if item.org_id}
            org_names = dict(Org.objects.filter(pk__in=org_ids).values_list("pk", "name"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Audit trail",
            "opts": self.model._meta,
            "form": form,
            "rows": [
                {"item": item, "org_name": org_names.get(item.org_id, "")}
                for item in (page.items if page else [])
            ],
            "next_cursor": page.next_cursor.encode() if page and page.next_cursor else None,
            "filters_query": filters_query,
            "sources": SOURCES,
        }
        return TemplateResponse(request, "admin/audit/audit_trail.html", context)


class AuditFilterForm(forms.Form):
    org = forms.ModelChoiceField(queryset=Org.objects.order_by("name"), required=False)
    job = forms.UUIDField(required=False, label="Job id")
    since = forms.DateTimeField(
        required=False,
        help_text="UTC, inclusive",
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"
        ),
    )
    until = forms.DateTimeField(
        required=False,
        help_text="UTC, exclusive",
        widget=forms.DateTimeInput(
            attrs={"type": "datetime-local", "step": "1"}, format="%Y-%m-%dT%H:%M:%S"
        ),
    )
    kind = forms.ChoiceField(
        choices=[
            ("", "decisions (all but metering)"),
            (EVERYTHING, "everything, metering included"),
            *((k, k) for k in KINDS),
        ],
        required=False,
    )
    limit = forms.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT)
    cursor = forms.CharField(required=False, widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and until <= since:
            self.add_error("until", "until must be later than since.")
        return data


admin.site.unregister(DispatchDecision)
admin.site.register(DispatchDecision, AuditTrailAdmin)
