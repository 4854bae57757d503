"""What every app's admin stands on: read-only pages for rows only services write, and a
filter on a foreign key to a table too large to list."""

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError


class ReadOnlyMixin:
    """Rows written only by the services (append-only logs, the dispatcher's records):
    operators read them here; nobody adds, edits or deletes them from the admin."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(ReadOnlyMixin, admin.ModelAdmin):
    pass


class ReadOnlyInline(ReadOnlyMixin, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False


class ChosenRowFilter(admin.SimpleListFilter):
    """A filter on a foreign key to a table too large to list: a sidebar with every org
    would be megabytes at tens of thousands of them, and its query would read them all.
    It shows only the row chosen (by a link from that row's page, or the URL), under its
    name, and filters by its id; nothing is shown until one is chosen. Subclasses set
    `title`, `parameter_name`, `field` (the foreign key on the listed model) and
    `related_model`."""

    field: str
    related_model: type

    def lookups(self, request, model_admin):
        pk = self._chosen_pk()
        if pk is None:
            return ()
        row = self.related_model._default_manager.filter(pk=pk).first()
        return ((self.value(), str(row) if row is not None else self.value()),)

    def queryset(self, request, queryset):
        pk = self._chosen_pk()
        return queryset if pk is None else queryset.filter(**{self.field: pk})

    def _chosen_pk(self):
        value = self.value()
        if value is None:
            return None
        try:
            return self.related_model._meta.pk.to_python(value)
        except ValidationError as exc:
            raise IncorrectLookupParameters(exc) from exc
