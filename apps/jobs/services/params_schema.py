"""The generator's params schema: `params` is checked against it at the door.

`GANTRY_GENERATOR_PARAMS_SCHEMA` names a JSON Schema file (the stand-in ships its own,
the default); an empty value turns the check off for a generator that publishes none.
A violation is a 400 naming the path (`params.steps`) before anything is held, instead
of a job that queues, takes a GPU, fails as `bad_input` and is charged.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from django.conf import settings
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match

from apps.core.errors import GantryError

_lock = threading.Lock()
_loaded: dict[tuple[str, int], tuple[dict, Draft202012Validator]] = {}


class SchemaUnavailable(GantryError):
    status_code = 404
    code = "not_found"


def _schema_path() -> Path | None:
    named = settings.GANTRY_GENERATOR_PARAMS_SCHEMA
    return Path(named) if named else None


def _load(path: Path) -> tuple[dict, Draft202012Validator]:
    """The schema and its validator, read once per file version (keyed by mtime)."""
    key = (str(path), path.stat().st_mtime_ns)
    loaded = _loaded.get(key)
    if loaded is None:
        with _lock:
            schema = json.loads(path.read_text(encoding="utf-8"))
            Draft202012Validator.check_schema(schema)
            loaded = _loaded[key] = (schema, Draft202012Validator(schema))
    return loaded


def generator_params_schema() -> dict:
    """The schema `params` must satisfy; 404 when the generator publishes none."""
    path = _schema_path()
    if path is None:
        raise SchemaUnavailable("The generator publishes no params schema.")
    return _load(path)[0]


def _field_of(error: ValidationError) -> str:
    """Dotted path of the offending value, down to the missing or unexpected key."""
    parts = ["params", *(f"[{p}]" if isinstance(p, int) else str(p) for p in error.path)]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [name for name in error.validator_value if name not in instance]
        parts.extend(missing[:1])
    elif error.validator == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {})
        extra = sorted(name for name in instance if name not in known)
        parts.extend(extra[:1])
    return ".".join(parts).replace(".[", "[")


def check_params(params) -> None:
    """Guarantee: returns only if `params` satisfies the generator's schema (or none is
    configured); otherwise raises a 400 `invalid` whose `field` names the path."""
    path = _schema_path()
    if path is None:
        return
    try:
        _, validator = _load(path)
    except (OSError, ValueError, SchemaError) as exc:
        # A broken schema is the operator's error: refuse loudly rather than run unchecked.
        raise GantryError(
            f"The generator's params schema cannot be read ({type(exc).__name__}).",
            code="schema_unavailable",
            status_code=503,
        ) from exc
    error = best_match(validator.iter_errors(params))
    if error is None:
        return
    field = _field_of(error)
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    raise GantryError(f"{field}: {message}", code="invalid", field=field)
