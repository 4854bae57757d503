"""Operator pages of the ledger. Money moves only through the services: buckets are
granted (never edited), holds are settled, entries are read-only. Grants, settlements
and budget changes made here are recorded as operator actions (the audit trail)."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import F
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse

from apps.accounts.admin import OrgAdmin, OrgFilter
from apps.accounts.models import Org, Project, User
from apps.accounts.operator_actions import operator_action, operator_of
from apps.core.admin import ReadOnlyAdmin
from apps.core.errors import GantryError
from apps.ledger import operations, selectors, services
from apps.ledger.forms import BucketGrantForm, BudgetForm, GrantForm
from apps.ledger.models import (
    Bucket,
    Budget,
    BudgetAlert,
    Entry,
    Hold,
    HoldAllocation,
    HoldState,
    LedgerAuditEvent,
)


@admin.register(Bucket)
class BucketAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "org",
        "project",
        "kind",
        "lane_display",
        "granted",
        "remaining_display",
        "held",
        "consumed",
        "expired",
        "expires_at",
        "expired_at",
        "created_at",
    )
    list_filter = (
        "kind",
        ("expires_at", admin.EmptyFieldListFilter),
        ("expired_at", admin.EmptyFieldListFilter),
        "org__tier",
        OrgFilter,
    )
    search_fields = (
        "id",
        "lane_of__id",
        "org__name",
        "project__name",
        "idempotency_key",
        "actor",
    )
    list_select_related = ("org", "project__org")  # a project's name shows its org
    readonly_fields = [f.name for f in Bucket._meta.fields]
    actions = ["grant_more"]

    @admin.display(description="grant / lane")
    def lane_display(self, obj):
        """The grant (its first lane's id; search by it to list every lane) and the lane."""
        return f"{str(obj.grant_id)[:8]} / {obj.lane}"

    @admin.display(
        description="remaining",
        ordering=F("granted") - F("consumed") - F("held") - F("expired"),
    )
    def remaining_display(self, obj):
        return obj.remaining

    def has_change_permission(self, request, obj=None):
        # Viewable, never editable: a bucket changes only through ledger entries.
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def add_view(self, request, form_url="", extra_context=None):
        """Adding a bucket is granting credit: the form calls services.grant()."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = BucketGrantForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                bucket = _grant(
                    request,
                    org=data["org"],
                    project=data["project"],
                    kind=data["kind"],
                    amount=data["amount"],
                    expires_at=data["expires_at"],
                    idempotency_key=data["idempotency_key"],
                )
            except GantryError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                self.message_user(request, f"Granted {bucket.granted} µc to {bucket.org}.")
                return redirect(reverse("admin:ledger_bucket_change", args=[bucket.pk]))
        return self._grant_page(request, form, title="Grant credits")

    @admin.action(description="Grant more credit to the orgs of the selected buckets")
    def grant_more(self, request, queryset):
        if not self.has_add_permission(request):
            raise PermissionDenied
        orgs = {bucket.org for bucket in queryset.select_related("org")}
        form = GrantForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            data = form.cleaned_data
            for org in sorted(orgs, key=lambda o: o.name):
                try:
                    _grant(
                        request,
                        org=org,
                        project=None,
                        kind=data["kind"],
                        amount=data["amount"],
                        expires_at=data["expires_at"],
                        idempotency_key=f"{data['idempotency_key']}:{org.pk}",
                    )
                except GantryError as exc:
                    self.message_user(request, f"{org}: {exc.message}", messages.ERROR)
                    return None
            self.message_user(request, f"Granted {data['amount']} µc to {len(orgs)} org(s).")
            return None
        return self._grant_page(
            request,
            form,
            title=f"Grant credits to {len(orgs)} org(s)",
            orgs=sorted(orgs, key=lambda o: o.name),
            queryset=queryset,
        )

    def _grant_page(self, request, form, *, title, orgs=None, queryset=None):
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "form": form,
            "opts": self.model._meta,
            "orgs": orgs,
            "selected": [str(pk) for pk in queryset.values_list("pk", flat=True)]
            if queryset is not None
            else None,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/ledger/grant_credits.html", context)


def _grant(request, *, org, project, kind, amount, expires_at, idempotency_key):
    """Grant and record it once per form submission (the form's key), like the API."""
    return operations.grant(
        actor=operator_of(request),
        org=org,
        project=project,
        kind=kind,
        amount=amount,
        expires_at=expires_at,
        idempotency_key=idempotency_key,
    )


class AllocationInline(admin.TabularInline):
    model = HoldAllocation
    extra = 0
    fields = ("bucket", "amount", "captured", "refunded")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Hold)
class HoldAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "org",
        "project",
        "user",
        "state",
        "amount",
        "captured",
        "refunded",
        "usage",
        "expires_at",
        "created_at",
        "settled_at",
    )
    list_filter = ("state", "org__tier", OrgFilter)
    search_fields = ("id", "org__name", "idempotency_key", "job_ref", "reason")
    list_select_related = ("org", "project__org", "user__org")  # their names show the org
    show_full_result_count = False  # one hold per job: no count of the whole table
    # Newest first along the primary key (ids are time-ordered): creation time has no
    # index, and sorting every hold took 24-35 ms a page view at 36,900 (a second at 1M).
    ordering = ("-id",)
    readonly_fields = [f.name for f in Hold._meta.fields]
    inlines = [AllocationInline]
    actions = ["settle_at_metered_usage"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Settle selected active holds at their metered usage")
    def settle_at_metered_usage(self, request, queryset):
        settled = 0
        for hold in queryset.filter(state=HoldState.ACTIVE):
            with operator_action(
                actor=operator_of(request),
                action="hold.settle",
                target_type="hold",
                target_id=hold.pk,
                org_id=hold.org_id,
                job_id=hold.job_ref,
                before=_hold_state(hold),
            ) as pending:
                result = services.settle(hold, reason=f"settled by {operator_of(request)}")
                pending.skip = result.replayed
                hold.refresh_from_db()
                pending.after = _hold_state(hold)
            settled += not result.replayed
        self.message_user(request, f"Settled {settled} hold(s).")


def _hold_state(hold: Hold) -> dict:
    return {
        "state": hold.state,
        "amount": hold.amount,
        "captured": hold.captured,
        "refunded": hold.refunded,
    }


class EntryLegsFilter(admin.SimpleListFilter):
    """Each move of money is two entries, the same amount with opposite signs on its two
    accounts. By default the list shows one row per move, its positive leg (account,
    counter account and amount say all of it), newest first through the entry_time
    index; both legs on request, newest first by a sort of every entry matched (an org's
    through entry_org_time)."""

    title = "legs"
    parameter_name = "legs"

    def lookups(self, request, model_admin):
        return (("both", "Both legs of each move"),)

    def choices(self, changelist):
        choices = super().choices(changelist)
        unset = next(choices)  # Django's "All": here, no value is one row per move
        yield {**unset, "display": "One row per move"}
        yield from choices

    def queryset(self, request, queryset):
        return queryset if self.value() == "both" else queryset.filter(amount__gt=0)


@admin.register(Entry)
class EntryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "created_at",
        "kind",
        "account",
        "counter_account",
        "amount",
        "org",
        "bucket",
        "hold",
        "job_id",
        "txn",
    )
    # The largest table of all: the page is read through indexes (see EntryLegsFilter),
    # dates as ranges (no date hierarchy: it reads every row's date), no count of the
    # whole table.
    list_filter = (
        EntryLegsFilter,
        "kind",
        "account",
        OrgFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("=txn", "=hold__id", "=job_id", "=bucket__id")
    search_help_text = "A transaction, hold, job or bucket id."
    list_select_related = ("org", "bucket", "hold")
    show_full_result_count = False
    ordering = ("-created_at", "-id")


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    form = BudgetForm
    list_display = (
        "org",
        "project",
        "user",
        "mode",
        "period",
        "limit",
        "held_total",
        "consumed_total",
        "lanes",
        "updated_at",
    )
    list_filter = ("mode", "period")
    search_fields = ("org__name", "project__name", "user__name")
    list_select_related = ("org", "project__org", "user__org")  # their names show the org
    readonly_fields = (
        "held_total",
        "consumed_total",
        "lanes",
        "period_start",
        "created_at",
        "updated_at",
    )

    # The lane machinery and the caches are set_budget's: never edited here.
    exclude = ("lane_of", "lane", "share", "unbalanced", "held", "consumed")

    def get_queryset(self, request):
        # A budget is listed once, as its first lane; its figures add its lanes up.
        return selectors.with_budget_usage(
            super().get_queryset(request).filter(lane_of__isnull=True)
        )

    @admin.display(description="held")
    def held_total(self, obj):
        return budget_usage_of_row(obj)[0]

    @admin.display(description="consumed")
    def consumed_total(self, obj):
        return budget_usage_of_row(obj)[1]

    def get_readonly_fields(self, request, obj=None):
        scope = ("org", "project", "user") if obj is not None else ()
        return (*scope, *self.readonly_fields)

    def get_form(self, request, obj=None, **kwargs):
        # On a change the scope is read-only, so BudgetForm (which narrows the scope's
        # choices) has no scope fields to narrow: a plain model form edits the rest.
        if obj is not None:
            kwargs["form"] = forms.ModelForm
        return super().get_form(request, obj, **kwargs)

    def save_model(self, request, obj, form, change):
        saved = operations.set_budget(
            actor=operator_of(request),
            org=obj.org,
            project=obj.project,
            user=obj.user,
            limit=obj.limit,
            period=obj.period,
            mode=obj.mode,
        )
        obj.pk = saved.pk
        obj.refresh_from_db()

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "budget", "org", "hold", "amount", "held", "consumed", "limit")
    search_fields = ("org__name", "=hold__id")
    list_select_related = ("budget", "org")
    show_full_result_count = False  # one per hold over a soft budget
    ordering = ("-id",)  # newest first along the primary key (as the holds page)


@admin.register(LedgerAuditEvent)
class LedgerAuditEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "check_name", "subject", "detail", "resolved_at")
    list_filter = ("check_name", ("resolved_at", admin.EmptyFieldListFilter))
    search_fields = ("subject", "detail")


def budget_usage_of_row(budget) -> tuple[int, int]:
    """The budget's (held, consumed) over its lanes: read with the page's rows
    (selectors.with_budget_usage), or once for a row read without them."""
    if hasattr(budget, "usage_held"):
        return budget.usage_held, budget.usage_consumed
    if not hasattr(budget, "_usage"):
        budget._usage = selectors.budget_usage(budget)
    return budget._usage


BUDGET_SETTINGS = ("limit", "period", "mode")


class BudgetInlineForm(forms.ModelForm):
    class Meta:
        model = Budget
        fields = ("project", "user", *BUDGET_SETTINGS)

    def clean(self):
        data = super().clean()
        if not self.instance._state.adding and any(
            name in self.changed_data for name in ("project", "user")
        ):
            raise forms.ValidationError(
                "A budget's scope (project, user) cannot change; add a budget for the new scope."
            )
        return data


class BudgetInline(admin.TabularInline):
    """The org's budgets (org-wide, per project, per user). Saved through the ledger's
    set_budget, which recomputes held/consumed from the holds; never deleted here."""

    model = Budget
    form = BudgetInlineForm
    extra = 0
    fields = ("project", "user", "limit", "period", "mode", "held_total", "consumed_total")
    readonly_fields = ("held_total", "consumed_total")
    can_delete = False
    verbose_name_plural = "budgets (limits in micro-credits; 1 credit = 1,000,000)"

    def get_queryset(self, request):
        # A budget is shown once, as its first lane; its figures add its lanes up.
        return selectors.with_budget_usage(
            super().get_queryset(request).filter(lane_of__isnull=True)
        )

    @admin.display(description="held")
    def held_total(self, obj):
        return budget_usage_of_row(obj)[0] if obj.pk else 0

    @admin.display(description="consumed")
    def consumed_total(self, obj):
        return budget_usage_of_row(obj)[1] if obj.pk else 0

    def get_formset(self, request, obj=None, **kwargs):
        self._org = obj  # the choices of project and user are the org's own
        return super().get_formset(request, obj, **kwargs)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        org = getattr(self, "_org", None)
        if db_field.name == "project":
            kwargs["queryset"] = Project.objects.filter(org=org) if org else Project.objects.none()
        if db_field.name == "user":
            kwargs["queryset"] = User.objects.filter(org=org) if org else User.objects.none()
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class LedgerOrgAdmin(OrgAdmin):
    """The accounts' org page with the org's budgets on it (the ledger's rows)."""

    inlines = [BudgetInline, *OrgAdmin.inlines]

    def save_formset(self, request, form, formset, change):
        if formset.model is not Budget:
            return super().save_formset(request, form, formset, change)
        # Budgets are set through the ledger's operations (caches recomputed), each recorded.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for budget_form in formset.forms:
            if not budget_form.has_changed() or not budget_form.cleaned_data:
                continue
            self._set_budget(request, form.instance, budget_form, formset)
        return None

    def _set_budget(self, request, org, budget_form, formset):
        data = budget_form.cleaned_data
        existing = not budget_form.instance._state.adding
        budget = operations.set_budget(
            actor=operator_of(request),
            org=org,
            project=data.get("project"),
            user=data.get("user"),
            **{name: data[name] for name in BUDGET_SETTINGS},
        )
        if existing:
            formset.changed_objects.append((budget, budget_form.changed_data))
        else:
            formset.new_objects.append(budget)


# The org page is the accounts app's; the ledger layer, above it, adds the budgets.
admin.site.unregister(Org)
admin.site.register(Org, LedgerOrgAdmin)
