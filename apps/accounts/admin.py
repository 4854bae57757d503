"""Operators' pages for tenancy: orgs (tier, weight, quotas), projects, users, API keys,
and the read-only log of operator actions. The org page's budgets are the ledger's
(apps.ledger.admin.LedgerOrgAdmin). Every change an operator makes here
goes through a service and is recorded as an OperatorAction (the audit trail)."""

import json

from django.conf import settings
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from apps.accounts import operations
from apps.accounts.models import APIKey, OperatorAction, Org, Project, User
from apps.accounts.operations import ORG_SETTINGS
from apps.accounts.operator_actions import operator_of
from apps.core.admin import ChosenRowFilter, ReadOnlyAdmin


def audit_link(*, label: str = "Audit trail", **filters) -> str:
    """A link to the admin's audit trail page, filtered (org=…, job=…)."""
    query = "&".join(f"{key}={value}" for key, value in filters.items())
    return format_html('<a href="{}?{}">{}</a>', reverse("admin:audit_trail"), query, label)


class ProjectInline(admin.TabularInline):
    """New projects only (through the operations, recorded); a project's name is how
    clients address it, so it is not edited here."""

    model = Project
    extra = 0
    fields = ("name", "created_at")
    readonly_fields = ("created_at",)

    def has_change_permission(self, request, obj=None):
        return False  # existing rows show read-only; new ones can still be added

    def has_delete_permission(self, request, obj=None):
        return False


class OrgFilter(ChosenRowFilter):
    """By org, for the lists of an org's rows: set by the links on the org list."""

    title = "org"
    parameter_name = "org__id__exact"
    field = "org_id"
    related_model = Org


@admin.register(Org)
class OrgAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "tier",
        "weight",
        "max_queued_jobs",
        "max_running_jobs",
        "rate_per_s",
        "created_at",
    )
    list_filter = ("tier", "dedup_enabled")
    search_fields = ("name", "id")
    readonly_fields = ("id", "tier_defaults", "audit", "created_at")
    fieldsets = (
        (None, {"fields": ("id", "name", "tier", "weight", "dedup_enabled", "audit")}),
        (
            "Quotas (empty: the tier's default)",
            {
                "fields": (
                    "tier_defaults",
                    "max_queued_jobs",
                    "max_running_jobs",
                    "rate_per_s",
                    "rate_burst",
                )
            },
        ),
        (None, {"fields": ("created_at",)}),
    )
    inlines = [ProjectInline]  # the ledger's admin adds the org's budgets (LedgerOrgAdmin)

    @admin.display(description="tier defaults")
    def tier_defaults(self, obj):
        defaults = settings.GANTRY_TIER_DEFAULTS.get(obj.tier) if obj and obj.pk else None
        if not defaults:
            return "-"
        return (
            f"{obj.tier}: max queued {defaults['max_queued']}, max running "
            f"{defaults['max_running']}, {defaults['rate_per_s']}/s (burst {defaults['burst']})"
        )

    @admin.display(description="audit trail")
    def audit(self, obj):
        return audit_link(label="Everything about this org", org=obj.pk) if obj and obj.pk else "-"

    def save_model(self, request, obj, form, change):
        """Creates and changes go through the accounts operations, which record them."""
        settings_now = {name: getattr(obj, name) for name in ORG_SETTINGS}
        if not change:
            created = operations.create_org(actor=operator_of(request), **settings_now)
            obj.pk, obj.created_at = created.pk, created.created_at
            obj._state.adding, obj._state.db = False, created._state.db
            return
        operations.update_org(obj, actor=operator_of(request), **settings_now)

    def save_formset(self, request, form, formset, change):
        if formset.model is Project:
            # New projects through the accounts operations (recorded); names stay as they are.
            formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
            for project_form in formset.forms:
                if project_form.instance._state.adding and project_form.has_changed():
                    formset.new_objects.append(
                        operations.create_project(
                            actor=operator_of(request),
                            org=form.instance,
                            name=project_form.cleaned_data["name"],
                        )
                    )
            return None
        return super().save_formset(request, form, formset, change)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    """Projects are created through the accounts operations (recorded as project.create);
    once created, their org and name (how clients address them) are read-only."""

    list_display = ("name", "org", "created_at")
    list_filter = ("org__tier",)
    search_fields = ("name", "org__name", "id")
    autocomplete_fields = ("org",)

    def get_readonly_fields(self, request, obj=None):
        return ("org", "name", "created_at") if obj is not None else ()

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        if change:
            return  # nothing is editable
        created = operations.create_project(actor=operator_of(request), org=obj.org, name=obj.name)
        obj.pk, obj.created_at = created.pk, created.created_at
        obj._state.adding, obj._state.db = False, created._state.db


@admin.register(User)
class UserAdmin(admin.ModelAdmin):
    """Users are created (user.create) and re-weighted (user.update) through the accounts
    operations, each recorded; their org and name are read-only once created."""

    list_display = ("name", "org", "weight", "created_at")
    list_filter = ("org__tier",)
    search_fields = ("name", "org__name", "id")
    autocomplete_fields = ("org",)

    def get_readonly_fields(self, request, obj=None):
        return ("org", "name", "created_at") if obj is not None else ()

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        actor = operator_of(request)
        if change:
            operations.set_user_weight(obj, actor=actor, weight=obj.weight)
            return
        created = operations.create_user(actor=actor, org=obj.org, name=obj.name, weight=obj.weight)
        obj.pk, obj.created_at = created.pk, created.created_at
        obj._state.adding, obj._state.db = False, created._state.db


@admin.register(APIKey)
class APIKeyAdmin(admin.ModelAdmin):
    """Keys are minted through the API or create_operator_key; here they are read and revoked."""

    list_display = (
        "prefix",
        "name",
        "is_operator",
        "org",
        "project",
        "user",
        "created_at",
        "revoked_at",
    )
    list_filter = ("is_operator", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("prefix", "name", "org__name")
    readonly_fields = ("prefix", "digest", "is_operator", "org", "project", "user", "created_at")
    # Newest first along the primary key (ids are time-ordered): a key per tenant at least,
    # and creation time has no index (a sort of 200,000 keys: 46-51 ms per page view).
    ordering = ("-id",)
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        revoked = 0
        for api_key in queryset.filter(revoked_at__isnull=True):
            operations.revoke_api_key(api_key, actor=operator_of(request))
            revoked += 1
        self.message_user(request, f"Revoked {revoked} key(s).")


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    """What operators did, as recorded; append-only (the database refuses changes)."""

    list_display = ("at", "actor", "action", "target_type", "target_id", "org", "outcome")
    list_filter = ("action", "outcome", "target_type")
    search_fields = ("actor", "target_id", "note", "=job_id", "org__name")
    list_select_related = ("org",)
    date_hierarchy = "at"
    fields = (
        "at",
        "actor",
        "action",
        "target_type",
        "target_id",
        "org",
        "job_id",
        "outcome",
        "note",
        "before_pretty",
        "after_pretty",
    )
    readonly_fields = fields

    @admin.display(description="before")
    def before_pretty(self, obj):
        return format_html("<pre>{}</pre>", json.dumps(obj.before, indent=2, sort_keys=True))

    @admin.display(description="after")
    def after_pretty(self, obj):
        return format_html("<pre>{}</pre>", json.dumps(obj.after, indent=2, sort_keys=True))
