from rest_framework.permissions import BasePermission


class IsAuthenticatedKey(BasePermission):
    message = "An API key is required."

    def has_permission(self, request, view):
        return request.auth is not None


class IsOperator(BasePermission):
    message = "This endpoint needs an operator key."

    def has_permission(self, request, view):
        return request.auth is not None and request.user.is_operator


class IsOperatorForWrites(BasePermission):
    """Org keys may read their own objects; only operators change them."""

    message = "Only an operator key can change this."

    def has_permission(self, request, view):
        if request.auth is None:
            return False
        return request.method in ("GET", "HEAD", "OPTIONS") or request.user.is_operator
