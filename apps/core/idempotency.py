"""Idempotency-Key handling for mutating endpoints.

The same key and body replay the first answer; the same key with a different body is a
409. Concurrent requests with one key are serialised by a transaction-scoped advisory
lock on (scope, key), so exactly one of them executes the view.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from rest_framework.response import Response

from apps.core import locks
from apps.core.errors import Conflict, GantryError
from apps.core.models import IdempotentRequest

HEADER = "HTTP_IDEMPOTENCY_KEY"
MAX_KEY_LENGTH = 255
# Printable ASCII: a key is stored as text and echoed in messages (no NUL, no controls).
KEY_CHARACTERS = re.compile(r"[\x20-\x7e]+")


def idempotency_key_of(request, *, required: bool) -> str:
    """The request's Idempotency-Key ('' when absent and not required); a missing
    required key, a key over MAX_KEY_LENGTH or one with characters other than printable
    ASCII is a 400 naming the header."""
    key = request.META.get(HEADER, "").strip()
    if not key:
        if required:
            raise GantryError(
                "The Idempotency-Key header is required.", code="invalid", field="Idempotency-Key"
            )
        return ""
    if len(key) > MAX_KEY_LENGTH:
        raise GantryError(
            f"Idempotency-Key longer than {MAX_KEY_LENGTH} characters.",
            code="invalid",
            field="Idempotency-Key",
        )
    if not KEY_CHARACTERS.fullmatch(key):
        raise GantryError(
            "Idempotency-Key may hold printable ASCII characters only.",
            code="invalid",
            field="Idempotency-Key",
        )
    return key


def caller_scope(request) -> str:
    """Whose keys these are: operators share one space; an org key's space is its org's,
    a project-bound key's its project's (the same key from another project is new)."""
    principal = request.user
    if principal.is_operator:
        return "operator"
    project_id = principal.project_id
    return f"{principal.org_id}/{project_id}" if project_id else str(principal.org_id)


def body_digest(request) -> str:
    canonical = json.dumps(request.data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{request.method} {request.path}\n{canonical}".encode()).hexdigest()


def idempotent(*, required: bool = False, secret_fields: tuple[str, ...] = ()):
    """Decorate a DRF view method so that it runs at most once per Idempotency-Key.

    The first answer is stored to be replayed, except its `secret_fields` (a new API
    key's `key`, shown once): a replay answers the same object without them."""

    def decorate(view_method):
        @functools.wraps(view_method)
        def wrapper(self, request, *args, **kwargs):
            key = idempotency_key_of(request, required=required)
            if not key:
                return view_method(self, request, *args, **kwargs)
            scope = caller_scope(request)
            digest = body_digest(request)
            with transaction.atomic():
                locks.xact_lock(f"{scope}|{key}")
                previous = IdempotentRequest.objects.filter(scope=scope, key=key).first()
                if previous is not None:
                    if previous.body_digest != digest:
                        raise Conflict(
                            "This Idempotency-Key was used with a different request body.",
                            code="idempotency_mismatch",
                            field="Idempotency-Key",
                        )
                    replay = Response(previous.response_body, status=previous.status_code)
                    replay["Idempotent-Replayed"] = "true"
                    return replay
                response = view_method(self, request, *args, **kwargs)
                if 200 <= response.status_code < 300:
                    IdempotentRequest.objects.create(
                        scope=scope,
                        key=key,
                        method=request.method,
                        path=request.path[:255],
                        body_digest=digest,
                        status_code=response.status_code,
                        # As the client got it (ids, times and decimals as JSON text).
                        response_body=_storable(response.data, secret_fields),
                    )
                return response

        return wrapper

    return decorate


def _storable(data, secret_fields: tuple[str, ...]):
    """The answer as the client got it (ids, times, decimals as JSON text), without the
    fields that must never be stored."""
    stored = json.loads(json.dumps(data, cls=DjangoJSONEncoder))
    if isinstance(stored, dict):
        for name in secret_fields:
            if name in stored:
                stored[name] = None
    return stored
