"""Bearer API-key authentication; request.user becomes a Principal."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication, exceptions

from apps.accounts.caches import key_cache
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
