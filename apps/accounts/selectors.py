"""Reads scoped to the caller: an org key sees only its own org's objects."""

import contextlib
import uuid

from django.db import connection
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from apps.accounts.caches import project_memo
from apps.accounts.models import APIKey, Org, Project, User
from apps.core.errors import GantryError


def visible_orgs(principal) -> QuerySet[Org]:
    orgs = Org.objects.all()
    return orgs if principal.is_operator else orgs.filter(pk=principal.org_id)


def org_for(principal, org_id) -> Org:
    """The org if the caller may see it; 404 otherwise (never 403: no existence leak)."""
    return get_object_or_404(visible_orgs(principal), pk=org_id)


def org_names(org_ids) -> dict[str, str]:
    """id (as a string) -> name of those of these orgs that exist, in one query."""
    return {
        str(pk): name for pk, name in Org.objects.filter(pk__in=org_ids).values_list("pk", "name")
    }


def projects_of(org: Org) -> QuerySet[Project]:
    return Project.objects.filter(org=org).order_by("-created_at", "-id")


def users_of(org: Org) -> QuerySet[User]:
    return User.objects.filter(org=org).order_by("-created_at", "-id")


def visible_api_keys(principal) -> QuerySet[APIKey]:
    """Operators: every key; an org key: its org's; a project-bound key: its project's."""
    keys = APIKey.objects.select_related("org")
    if principal.is_operator:
        return keys
    keys = keys.filter(org_id=principal.org_id)
    if principal.project_id:
        keys = keys.filter(project_id=principal.project_id)
    return keys


def resolve_project(org: Org, ref, *, key_project: Project | None = None) -> Project:
    """The org's project named by id or name; a key narrowed to a project may only use it.

    Unknown (or another org's) project: 400 naming `project`. Another project than the
    key's: 403.
    """
    if ref in (None, ""):
        if key_project is not None:
            return key_project
        raise GantryError("project: this field is required.", code="invalid", field="project")
    ref = str(ref)
    if key_project is not None and ref in (str(key_project.id), key_project.name):
        return key_project
    project = find_project(org, ref)
    if project is None:
        raise GantryError(
            f"project: no project {ref!r} in this org.", code="invalid", field="project"
        )
    if key_project is not None and project.id != key_project.id:
        raise GantryError(
            "project: this API key may only submit to its own project.",
            code="forbidden",
            field="project",
            status_code=403,
        )
    return project


_PROJECT_SQL = """
SELECT id, org_id, name, created_at FROM accounts_project
WHERE org_id = %(org)s AND (id = %(id)s OR name = %(name)s)
ORDER BY id = %(id)s DESC NULLS LAST
LIMIT 1
"""


def find_project(org: Org, ref: str) -> Project | None:
    """The org's project with this id (preferred) or name, in one plain query (hot path);
    its row is remembered a few seconds by this process (the API never deletes one)."""
    row = project_memo.get((org.id, ref))
    if row is None:
        project_id = None
        with contextlib.suppress(ValueError):
            project_id = uuid.UUID(ref)
        with connection.cursor() as cursor:
            cursor.execute(_PROJECT_SQL, {"org": org.id, "id": project_id, "name": ref})
            row = cursor.fetchone()
        if row is None:
            return None
        project_memo.put((org.id, ref), row)
    project = Project.from_db("default", ["id", "org_id", "name", "created_at"], row)
    project.org = org
    return project
