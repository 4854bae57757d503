from django.urls import path

from apps.accounts import views

urlpatterns = [
    path("orgs", views.OrgListView.as_view(), name="orgs"),
    path("orgs/<uuid:org>", views.OrgDetailView.as_view(), name="org"),
    path("orgs/<uuid:org>/projects", views.ProjectListView.as_view(), name="org-projects"),
    path("orgs/<uuid:org>/users", views.UserListView.as_view(), name="org-users"),
    path("api-keys", views.APIKeyListView.as_view(), name="api-keys"),
    path("api-keys/<uuid:key_id>", views.APIKeyDetailView.as_view(), name="api-key"),
]
