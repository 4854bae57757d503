"""Input checks shared by the ledger services: each refusal is a 400 naming the field."""

from __future__ import annotations

from apps.core.errors import GantryError


def positive_amount(value, *, field: str = "amount") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise GantryError(
            f"{field} must be a positive integer of micro-credits.", code="invalid", field=field
        )
    return value


def non_negative(value, *, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GantryError(f"{field} must be a non-negative integer.", code="invalid", field=field)
    return value


def key_or_error(value, *, field: str = "idempotency_key") -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise GantryError(
            f"{field} must be a non-empty string of at most 255 characters.",
            code="invalid",
            field=field,
        )
    return value


def check_scope(*, org, project=None, user=None) -> None:
    if project is not None and project.org_id != org.pk:
        raise GantryError("The project belongs to another org.", code="invalid", field="project")
    if user is not None and user.org_id != org.pk:
        raise GantryError("The user belongs to another org.", code="invalid", field="user")
