"""Reads scoped to the caller: an org key sees only its own org's objects."""

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from apps.accounts.models import APIKey, Org, Project, User


def visible_orgs(principal) -> QuerySet[Org]:
    orgs = Org.objects.all()
    return orgs if principal.is_operator else orgs.filter(pk=principal.org_id)


def org_for(principal, org_id) -> Org:
    """The org if the caller may see it; 404 otherwise (never 403: no existence leak)."""
    return get_object_or_404(visible_orgs(principal), pk=org_id)


def projects_of(org: Org) -> QuerySet[Project]:
    return Project.objects.filter(org=org).order_by("-created_at", "-id")


def users_of(org: Org) -> QuerySet[User]:
    return User.objects.filter(org=org).order_by("-created_at", "-id")


def visible_api_keys(principal) -> QuerySet[APIKey]:
    keys = APIKey.objects.select_related("org")
    return keys if principal.is_operator else keys.filter(org_id=principal.org_id)
