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
            "properties": {"results": schema, "next": {"type": "string", "nullable": True}},
        }


class OldestFirstCursorPagination(OpaqueCursorPagination):
    ordering = ("created_at", "id")
