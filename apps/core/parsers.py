"""The API's JSON parser: only JSON that PostgreSQL and our digests can hold gets in.

DRF's parser accepts what Python's `json` accepts, and some of that breaks later, deep
inside a service, as a 500: a lone surrogate (`"\\ud800"`) cannot be encoded as UTF-8 (the
idempotency digest), a NUL cannot be stored in `jsonb` or `text`, `1e999` parses to
infinity (which `jsonb` refuses) and 5,000 nested arrays raise RecursionError. Each is
refused here as a 400 that names where it is (`params.prompt`).
"""

from __future__ import annotations

import codecs
import json
import math

from django.conf import settings
from rest_framework.parsers import JSONParser

from apps.core.errors import GantryError

MAX_DEPTH = 32
"""Deepest nesting of objects and arrays a body may have (params included)."""


class MalformedBody(GantryError):
    code = "malformed"


def _refuse(path: str, problem: str):
    return MalformedBody(f"{path or 'the body'}: {problem}", field=path or None)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def check_text(text: str, path: str) -> None:
    """Refuse a NUL or a lone surrogate in `text` (found at `path`)."""
    if "\x00" in text:
        raise _refuse(path, "contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(path, "contains a lone UTF-16 surrogate") from None


def check_document(document, *, max_depth: int = MAX_DEPTH) -> None:
    """Walk a parsed JSON document (iteratively: its depth is what is being checked) and
    refuse what cannot travel further: nesting deeper than `max_depth`, NULs and lone
    surrogates in keys and strings, non-finite numbers."""
    stack = [(document, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= max_depth:
                raise _refuse(path, f"nested deeper than {max_depth} levels")
            for key, item in value.items():
                check_text(key, path)
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            if depth >= max_depth:
                raise _refuse(path, f"nested deeper than {max_depth} levels")
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            check_text(value, path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _refuse(path, "number out of range")


class StrictJSONParser(JSONParser):
    """JSON bodies checked by `check_document`; a refusal is a 400 `malformed` naming the path."""

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.getreader(encoding)(stream).read()
            document = json.loads(text, parse_constant=_refuse_constant)
        except RecursionError:
            raise _refuse("", f"nested deeper than {MAX_DEPTH} levels") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise _refuse("", f"not valid JSON ({exc})") from None
        check_document(document)
        return document
