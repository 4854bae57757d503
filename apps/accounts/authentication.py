"""Bearer API-key authentication; request.user becomes a Principal."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from django.conf import settings
from rest_framework import authentication, exceptions

from apps.accounts.models import APIKey
from apps.accounts.services import digest_key


@dataclass(frozen=True)
class Principal:
    """Who is calling: an operator, or an org narrowed optionally to a project and user."""

    api_key: APIKey

    is_authenticated = True

    @property
    def is_operator(self) -> bool:
        return self.api_key.is_operator

    @property
    def org_id(self):
        return self.api_key.org_id

    @property
    def org(self):
        return self.api_key.org

    @property
    def project_id(self):
        return self.api_key.project_id

    @property
    def user_id(self):
        return self.api_key.user_id


class ProcessMemo:
    """A short per-process memory of looked-up rows (API keys, projects): submission is
    the hot path, and these lookups were a sizeable share of it. A change reaches other
    processes within GANTRY_API_KEY_CACHE_S; in the changing process at once (forget)."""

    def __init__(self):
        self._entries: dict = {}
        self._lock = threading.Lock()

    def get(self, key):
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key, value) -> None:
        ttl = settings.GANTRY_API_KEY_CACHE_S
        if ttl <= 0:
            return
        with self._lock:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[key] = (time.monotonic() + ttl, value)

    def forget(self, key) -> None:
        with self._lock:
            self._entries.pop(key, None)


key_cache = ProcessMemo()  # API keys by digest
project_memo = ProcessMemo()  # project rows by (org id, id or name)


class APIKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header:
            return None
        if header[0].decode(errors="replace").lower() != self.keyword.lower() or len(header) != 2:
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        digest = digest_key(header[1].decode(errors="replace"))
        api_key = key_cache.get(digest)
        if api_key is None:
            api_key = (
                APIKey.objects.select_related("org", "project", "user")
                .filter(digest=digest, revoked_at__isnull=True)
                .first()
            )
            if api_key is not None:
                key_cache.put(digest, api_key)
        if api_key is None or not api_key.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        return Principal(api_key), api_key

    def authenticate_header(self, request):
        return self.keyword
