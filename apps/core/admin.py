"""What every app's admin stands on: read-only pages for rows only services write."""

from django.contrib import admin


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
