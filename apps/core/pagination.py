"""Cursor pagination answering {"results": [...], "next": cursor or null}."""

from base64 import b64encode
from datetime import UTC, datetime
from urllib import parse

from django.core import exceptions as django_exceptions
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response


class OpaqueCursorPagination(CursorPagination):
    """Stable keyset pagination; `next` is an opaque token passed back as ?cursor=."""

    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = ("-created_at", "-id")
    _model = None  # the paginated queryset's model, for decode_cursor (DRF passes no queryset)

    def encode_cursor(self, cursor):
        tokens = {}
        if cursor.offset != 0:
            tokens["o"] = str(cursor.offset)
        if cursor.reverse:
            tokens["r"] = "1"
        if cursor.position is not None:
            tokens["p"] = cursor.position
        return b64encode(parse.urlencode(tokens, doseq=True).encode("ascii")).decode("ascii")

    def get_page_size(self, request):
        """?limit=, 1 to max_page_size (empty: the default); anything else is a 400 naming
        `limit` (as the jobs list and the audit trail answer), not silently the default."""
        raw = request.query_params.get(self.page_size_query_param)
        if not raw:  # absent or empty
            return self.page_size
        try:
            size = int(raw)
        except ValueError:
            size = 0
        if not 1 <= size <= self.max_page_size:
            raise ValidationError(
                {"limit": [f"Must be an integer from 1 to {self.max_page_size}."]}
            )
        return size

    def paginate_queryset(self, queryset, request, view=None):
        self._model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        """The cursor of ?cursor=, or a 400 naming `cursor` for anything `encode_cursor`
        could not have made: undecodable, or a position that is no value of the first
        ordering field (a tampered token must not reach PostgreSQL as a bad literal)."""
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                self._check_position(cursor.position)
        except Exception as exc:  # DRF raises NotFound; a bad cursor is bad input
            raise ValidationError({"cursor": ["Invalid cursor."]}) from exc
        return cursor

    def _check_position(self, position: str) -> None:
        """Raise unless `position` is a value the first ordering field can hold."""
        if "\x00" in position:
            raise ValueError("a NUL in the position")
        if self._model is None:  # decoded outside paginate_queryset: nothing to check
            return
        field = self._model._meta.get_field(self.ordering[0].lstrip("-"))
        try:
            value = field.get_prep_value(field.to_python(position))
        except django_exceptions.ValidationError as exc:
            raise ValueError(position) from exc
        if isinstance(value, datetime) and value.tzinfo is not None:
            value.astimezone(UTC)  # OverflowError past year 9999 in UTC

    def get_paginated_response(self, data):
        return Response({"results": data, "next": self.get_next_link()})

    def get_paginated_response_schema(self, schema):
        return {
            "type": "object",
            "required": ["results", "next"],
            "properties": {
                "results": schema,
                "next": {
                    "type": "string",
                    "nullable": True,
                    "description": "Pass back as ?cursor= (with the same filters) for the "
                    "next page; null at the end.",
                    "example": None,
                },
            },
        }

    def get_schema_operation_parameters(self, view):
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "The `next` of the previous page (absent or empty: the first).",
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param,
                "required": False,
                "in": "query",
                "description": f"Items per page, 1 to {self.max_page_size} "
                f"(default {self.page_size}).",
                "schema": {"type": "integer", "minimum": 1, "maximum": self.max_page_size},
            },
        ]


class OldestFirstCursorPagination(OpaqueCursorPagination):
    ordering = ("created_at", "id")
