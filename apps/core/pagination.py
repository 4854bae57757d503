"""Cursor pagination answering {"results": [...], "next": cursor or null}."""

from base64 import b64encode
from urllib import parse

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.response import Response


class OpaqueCursorPagination(CursorPagination):
    """Stable keyset pagination; `next` is an opaque token passed back as ?cursor=."""

    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = ("-created_at", "-id")

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

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except Exception as exc:  # DRF raises NotFound; a bad cursor is bad input
            raise ValidationError({"cursor": ["Invalid cursor."]}) from exc

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
