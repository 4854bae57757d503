"""Operators' changes to tenancy, each recorded as an OperatorAction in its transaction.

The admin and the operator API both call these, so one action has one name and one
shape in the audit trail whichever way it was made. `actor` is `operator_of(request)`;
`record_refused` is the admin's (a refused action is recorded too) or the API's (False:
an error answer records nothing). The plain services (apps.accounts.services) stay the
unrecorded building blocks, e.g. for bootstrap commands and tests.
"""

from __future__ import annotations

from apps.accounts import services
from apps.accounts.models import APIKey, Org, Project, User
from apps.accounts.operator_actions import operator_action

# The fields of an org an operator sets, recorded before/after in the audit trail.
ORG_SETTINGS = (
    "name",
    "tier",
    "weight",
    "max_queued_jobs",
    "max_running_jobs",
    "rate_per_s",
    "rate_burst",
    "dedup_enabled",
)


def create_org(*, actor: str, record_refused: bool = True, **settings) -> Org:
    """Create an org (services.create_org), recorded as org.create with its settings."""
    with operator_action(
        actor=actor,
        action="org.create",
        target_type="org",
        target_id="",
        record_refused=record_refused,
    ) as pending:
        org = services.create_org(**settings)
        pending.target_id = pending.org_id = org.pk
        pending.after = {name: getattr(org, name) for name in ORG_SETTINGS}
    return org


def update_org(org: Org, *, actor: str, record_refused: bool = True, **changes) -> Org:
    """Change an org's settings, recorded as org.update with the changed fields before and
    after; a change that changes nothing records nothing. Returns the org as it now is."""
    with operator_action(
        actor=actor,
        action="org.update",
        target_type="org",
        target_id=org.pk,
        org_id=org.pk,
        record_refused=record_refused,
    ) as pending:
        current = Org.objects.select_for_update().get(pk=org.pk)
        changed = [name for name, value in changes.items() if getattr(current, name) != value]
        pending.before = {name: getattr(current, name) for name in changed}
        pending.after = {name: changes[name] for name in changed}
        pending.skip = not changed
        if changed:
            services.update_org(current, **pending.after)
    return current


def create_project(*, actor: str, org: Org, name: str, record_refused: bool = True) -> Project:
    with operator_action(
        actor=actor,
        action="project.create",
        target_type="project",
        target_id="",
        org_id=org.pk,
        record_refused=record_refused,
    ) as pending:
        project = services.create_project(org=org, name=name)
        pending.target_id = project.pk
        pending.after = {"name": project.name}
    return project


def create_user(*, actor: str, org: Org, record_refused: bool = True, **fields) -> User:
    with operator_action(
        actor=actor,
        action="user.create",
        target_type="user",
        target_id="",
        org_id=org.pk,
        record_refused=record_refused,
    ) as pending:
        user = services.create_user(org=org, **fields)
        pending.target_id = user.pk
        pending.after = {"name": user.name, "weight": user.weight}
    return user


def set_user_weight(user: User, *, actor: str, weight: float, record_refused: bool = True) -> User:
    """Change a user's weight, recorded as user.update (before/after); the same weight
    records nothing."""
    with operator_action(
        actor=actor,
        action="user.update",
        target_type="user",
        target_id=user.pk,
        org_id=user.org_id,
        record_refused=record_refused,
    ) as pending:
        current = User.objects.select_for_update().get(pk=user.pk)
        pending.skip = current.weight == weight
        pending.before, pending.after = {"weight": current.weight}, {"weight": weight}
        if not pending.skip:
            services.set_user_weight(current, weight=weight)
    return current


def issue_api_key(*, actor: str, record_refused: bool = True, **scope) -> services.IssuedKey:
    """Mint a key, recorded as apikey.create with its scope and prefix (never the key)."""
    with operator_action(
        actor=actor,
        action="apikey.create",
        target_type="apikey",
        target_id="",
        org_id=getattr(scope.get("org"), "pk", None),
        record_refused=record_refused,
    ) as pending:
        issued = services.issue_api_key(**scope)
        api_key = issued.api_key
        pending.target_id = api_key.prefix
        pending.after = {
            "id": api_key.pk,
            "name": api_key.name,
            "is_operator": api_key.is_operator,
            "project": str(api_key.project_id or ""),
            "user": str(api_key.user_id or ""),
        }
    return issued


def revoke_api_key(api_key: APIKey, *, actor: str, record_refused: bool = True) -> APIKey:
    """Revoke a key, recorded as apikey.revoke; revoking a revoked key records nothing."""
    with operator_action(
        actor=actor,
        action="apikey.revoke",
        target_type="apikey",
        target_id=api_key.prefix,
        org_id=api_key.org_id,
        before={"revoked_at": None},
        record_refused=record_refused,
    ) as pending:
        current = APIKey.objects.select_for_update().get(pk=api_key.pk)
        pending.skip = current.revoked_at is not None
        services.revoke_api_key(api_key)
        pending.after = {"revoked_at": api_key.revoked_at}
    return api_key
