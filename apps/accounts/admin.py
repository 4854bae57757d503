from django.contrib import admin

from apps.accounts.models import APIKey, Org, Project, User


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0
    fields = ("name", "created_at")
    readonly_fields = ("created_at",)


@admin.register(Org)
class OrgAdmin(admin.ModelAdmin):
    list_display = ("name", "tier", "weight", "max_queued_jobs", "max_running_jobs", "created_at")
    list_filter = ("tier", "dedup_enabled")
    search_fields = ("name", "id")
    inlines = [ProjectInline]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "org", "created_at")
    list_filter = ("org__tier",)
    search_fields = ("name", "org__name", "id")
    autocomplete_fields = ("org",)


@admin.register(User)
class UserAdmin(admin.ModelAdmin):
    list_display = ("name", "org", "weight", "created_at")
    list_filter = ("org__tier",)
    search_fields = ("name", "org__name", "id")
    autocomplete_fields = ("org",)


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
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        from apps.accounts.services import revoke_api_key

        for api_key in queryset:
            revoke_api_key(api_key)
