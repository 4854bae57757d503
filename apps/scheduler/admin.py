"""Operators' view of the fleet and of the dispatcher's decisions, and the page an operator
lives in: the fleet (what runs where, drain/undrain). The audit trail page is the audit
app's (apps.audit.admin). Changes made here go through the services and are recorded as
operator actions."""

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from apps.accounts.operator_actions import operator_action, operator_of
from apps.core.admin import ReadOnlyAdmin
from apps.core.errors import GantryError
from apps.fleet import operations
from apps.fleet import services as fleet_services
from apps.fleet.models import Gpu, GpuType, Node, NodeState
from apps.scheduler.models import DispatchDecision, NodeClaim, UsageAccount
from apps.scheduler.selectors_fleet import fleet_overview, nodes_shown

admin.site.site_header = "Gantry operations"
admin.site.site_title = "Gantry"
admin.site.index_title = "Operations"
# The index opens with the fleet and audit trail pages above the models.
admin.site.index_template = "admin/gantry_index.html"


class GpuTypeForm(forms.ModelForm):
    """The fields' checks, then the fleet's own (apps.fleet.services.check_gpu_type), so
    that what the service would refuse is an error on the form, not a failed save."""

    class Meta:
        model = GpuType
        fields = ("name", "memory_gb", "price_per_gpu_hour")

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            fleet_services.check_gpu_type(
                name=data.get("name"),  # a new type's (the field is read-only on a change)
                memory_gb=data.get("memory_gb"),
                price_per_gpu_hour=data.get("price_per_gpu_hour"),
            )
        except GantryError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return data


@admin.register(GpuType)
class GpuTypeAdmin(admin.ModelAdmin):
    """Prices apply to placements from now on; running attempts keep the price they got.
    A save goes through apps.fleet.operations.set_gpu_type, as PUT /v1/fleet/gpu-types/
    {name} does (recorded as gpu_type.update)."""

    form = GpuTypeForm
    list_display = ("name", "memory_gb", "price_per_gpu_hour", "gpu_count")
    search_fields = ("name",)

    def get_readonly_fields(self, request, obj=None):
        # The name is the key: renaming would add another type, not change this one.
        return ("name",) if obj else ()

    def save_model(self, request, obj, form, change):
        operations.set_gpu_type(
            actor=operator_of(request),
            name=obj.pk,
            memory_gb=obj.memory_gb,
            price_per_gpu_hour=obj.price_per_gpu_hour,
        )

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_gpus=Count("gpus"))

    @admin.display(description="GPUs", ordering="_gpus")
    def gpu_count(self, obj):
        return obj._gpus


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "gpu_type", "device_id")
    ordering = ("index",)


FLEET_PAGE_NODES = 50  # nodes per page of the fleet view


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "gpu_count", "busy_gpus", "queue", "updated_at")
    list_filter = ("state", "gpus__gpu_type")
    search_fields = ("name",)
    readonly_fields = ("queue", "created_at", "updated_at")
    inlines = [GpuInline]
    actions = ["drain", "undrain", "remove"]
    change_list_template = "admin/scheduler/node/change_list.html"

    def get_urls(self):
        fleet = path("fleet/", self.admin_site.admin_view(self.fleet_view), name="fleet")
        return [fleet, *super().get_urls()]

    def get_readonly_fields(self, request, obj=None):
        # An existing node changes state only through the guarded actions below.
        return (*self.readonly_fields, "state") if obj else self.readonly_fields

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                _gpus=Count("gpus", distinct=True),
                _busy=Count(
                    "gpus",
                    filter=Q(
                        gpus__assignments__isnull=False,
                        gpus__assignments__released_at__isnull=True,
                    ),
                    distinct=True,
                ),
            )
        )

    @admin.display(description="GPUs", ordering="_gpus")
    def gpu_count(self, obj):
        return obj._gpus

    @admin.display(description="GPUs in use", ordering="_busy")
    def busy_gpus(self, obj):
        return obj._busy

    @admin.action(description="Drain selected nodes (no new work; running jobs finish)")
    def drain(self, request, queryset):
        self._each(request, queryset, operations.drain_node, "drained")

    @admin.action(description="Undrain selected nodes (active again)")
    def undrain(self, request, queryset):
        self._each(request, queryset, operations.undrain_node, "made active")

    @admin.action(description="Remove selected nodes (only if nothing runs there)")
    def remove(self, request, queryset):
        self._each(request, queryset, operations.remove_node, "removed")

    def _each(self, request, queryset, operation, done: str):
        names = list(queryset.values_list("name", flat=True))
        ok = []
        for name in names:
            try:
                operation(actor=operator_of(request), name=name)
                ok.append(name)
            except GantryError as exc:
                self.message_user(request, f"{name}: {exc.message}", level=messages.ERROR)
        if ok:
            self.message_user(request, f"{done.capitalize()}: {', '.join(ok)}.")

    def save_model(self, request, obj, form, change):
        # Recorded in save_related, once the GPUs of the inline are saved too.
        request._gantry_node_before = operations.node_snapshot(obj.pk) if change else {}
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        with operator_action(
            actor=operator_of(request),
            action="node.update" if change else "node.add",
            target_type="node",
            target_id=form.instance.name,
            before=getattr(request, "_gantry_node_before", {}),
        ) as pending:
            super().save_related(request, form, formsets, change)
            pending.after = operations.node_snapshot(form.instance.pk)
            pending.skip = change and pending.after == pending.before

    def fleet_view(self, request):
        """Every node and GPU with what runs on it; drain or undrain a node from here."""
        if request.method == "POST":
            if not self.has_change_permission(request):
                raise PermissionDenied
            operation = {"drain": operations.drain_node, "undrain": operations.undrain_node}.get(
                request.POST.get("op", "")
            )
            name = request.POST.get("node", "")
            if operation is None or not name:
                self.message_user(request, "Choose a node and drain or undrain.", messages.ERROR)
            else:
                try:
                    node = operation(actor=operator_of(request), name=name)
                    self.message_user(
                        request, f"Node {name} is now {node.state}.", messages.SUCCESS
                    )
                except GantryError as exc:
                    self.message_user(request, f"{name}: {exc.message}", messages.ERROR)
            return redirect(reverse("admin:fleet"))
        state = request.GET.get("state") or None
        if state not in (None, *NodeState.values):
            state = None
        try:
            refresh = max(0, min(int(request.GET.get("refresh", "0")), 3600))
        except ValueError:
            refresh = 0
        fleet = fleet_overview(state=state)
        busy_only, name_contains = request.GET.get("busy") == "1", request.GET.get("q", "")
        # A page of nodes: the trace's fleet is 1,213 nodes and 6,212 GPUs, megabytes of
        # rows on one page; the cards above still count the whole fleet.
        shown = nodes_shown(fleet, busy_only=busy_only, name_contains=name_contains)
        page = Paginator(shown, FLEET_PAGE_NODES).get_page(request.GET.get("page"))
        kept = request.GET.copy()
        kept.pop("page", None)
        context = {
            **self.admin_site.each_context(request),
            "title": "Fleet",
            "opts": self.model._meta,
            "fleet": fleet,
            "page": page,
            "busy_only": busy_only,
            "name_contains": name_contains,
            "kept_query": kept.urlencode(),
            "state": state,
            "states": NodeState.choices,
            "refresh": refresh,
            "can_change": self.has_change_permission(request),
        }
        return TemplateResponse(request, "admin/scheduler/fleet.html", context)


@admin.register(DispatchDecision)
class DispatchDecisionAdmin(ReadOnlyAdmin):
    list_display = ("at", "kind", "outcome", "job", "node_name", "gpu_type", "gpu_indices")
    # Every tick writes rows here: dates as ranges on the `at` index (no date hierarchy:
    # it reads every row's date), no count of the whole table, ids matched exactly.
    list_filter = ("kind", "outcome", "gpu_type", ("at", admin.DateFieldListFilter))
    search_fields = ("=job__id", "=node_name", "reason", "skip_reason")
    show_full_result_count = False
    list_select_related = False
    raw_id_fields = ("job", "attempt")


@admin.register(NodeClaim)
class NodeClaimAdmin(ReadOnlyAdmin):
    list_display = ("job", "node", "kind", "created_at")
    list_filter = ("kind",)
    raw_id_fields = ("job", "decision")


@admin.register(UsageAccount)
class UsageAccountAdmin(ReadOnlyAdmin):
    list_display = ("scope", "key", "value", "as_of")
    list_filter = ("scope",)
    search_fields = ("key",)
