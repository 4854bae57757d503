"""Tenancy services: create orgs, projects, users and API keys."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.accounts.caches import key_cache
from apps.accounts.models import APIKey, Org, Project, User
from apps.core.errors import Conflict, GantryError

KEY_PREFIX = "gk_"


def digest_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedKey:
    api_key: APIKey
    raw_key: str  # shown once, never stored


def create_org(*, name: str, tier: str, weight: float = 1.0, **options) -> Org:
    """Create an org; a duplicate name is a 409, never a second org."""
    try:
        with transaction.atomic():
            return Org.objects.create(name=name, tier=tier, weight=weight, **options)
    except IntegrityError as exc:
        raise Conflict(f"An org named {name!r} already exists.", field="name") from exc


def update_org(org: Org, **changes) -> Org:
    """Change an org's fields; renaming it to another org's name is a 409."""
    for field, value in changes.items():
        setattr(org, field, value)
    try:
        with transaction.atomic():
            org.save(update_fields=list(changes))
    except IntegrityError as exc:
        if "name" in changes and Org.objects.filter(name=org.name).exclude(pk=org.pk).exists():
            raise Conflict(f"An org named {org.name!r} already exists.", field="name") from exc
        raise
    return org


def create_project(*, org: Org, name: str) -> Project:
    try:
        with transaction.atomic():
            return Project.objects.create(org=org, name=name)
    except IntegrityError as exc:
        raise Conflict(f"Org already has a project named {name!r}.", field="name") from exc


def create_user(*, org: Org, name: str, weight: float = 1.0) -> User:
    try:
        with transaction.atomic():
            return User.objects.create(org=org, name=name, weight=weight)
    except IntegrityError as exc:
        raise Conflict(f"Org already has a user named {name!r}.", field="name") from exc


def set_user_weight(user: User, *, weight: float) -> User:
    """Change the user's fair-share weight within its org (must be positive)."""
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
        raise GantryError("weight must be a positive number.", code="invalid", field="weight")
    user.weight = weight
    user.save(update_fields=["weight"])
    return user


def issue_api_key(
    *,
    org: Org | None = None,
    project: Project | None = None,
    user: User | None = None,
    operator: bool = False,
    name: str = "",
) -> IssuedKey:
    """Mint a key. The raw key is returned once; only its digest and prefix are stored."""
    if operator and (org or project or user):
        raise GantryError("An operator key belongs to no org.", field="org")
    if not operator and org is None:
        raise GantryError("A key needs an org (or must be an operator key).", field="org")
    if project is not None and project.org_id != org.id:
        raise GantryError("The project belongs to another org.", field="project")
    if user is not None and user.org_id != org.id:
        raise GantryError("The user belongs to another org.", field="user")
    public = secrets.token_hex(4)
    raw_key = f"{KEY_PREFIX}{public}_{secrets.token_urlsafe(32)}"
    api_key = APIKey.objects.create(
        name=name,
        prefix=f"{KEY_PREFIX}{public}",
        digest=digest_key(raw_key),
        is_operator=operator,
        org=org,
        project=project,
        user=user,
    )
    return IssuedKey(api_key=api_key, raw_key=raw_key)


def revoke_api_key(api_key: APIKey) -> APIKey:
    """Revoke once (revoking again keeps the first time); see ProcessMemo for the delay."""
    APIKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    api_key.refresh_from_db(fields=["revoked_at"])
    key_cache.forget(api_key.digest)
    return api_key
