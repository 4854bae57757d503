"""JSON bodies, typed as the schema says: a value must be of the JSON type of its field.

DRF's fields coerce: a CharField takes 42, an IntegerField "42", a BooleanField "yes" or
1, a UUIDField an integer. The OpenAPI schema says `"type": "string"`, `"integer"`,
`"boolean"`, so such a body is refused here with a 400 naming the field, the way a
client reading the schema expects. So is a string longer than its field's `max_length`
as sent (its schema's `maxLength`; DRF measures it after trimming its blanks). `null`
and absent values are left to the fields (`allow_null`, `required`); what a value must
be beyond that (bounds, formats, choices) stays the fields' job.
"""

from __future__ import annotations

from functools import cache

from rest_framework import serializers

# (field class, JSON types accepted, what the refusal says): the first match wins, so
# subclasses come before their bases.
_RULES: tuple[tuple[type, tuple[type, ...], str], ...] = (
    (serializers.BooleanField, (bool,), "Must be a boolean (true or false)."),
    (serializers.IntegerField, (int,), "Must be an integer."),
    (serializers.FloatField, (int, float), "Must be a number."),
    (serializers.DecimalField, (int, float), "Must be a number."),
    (serializers.CharField, (str,), "Must be a string."),
    (serializers.UUIDField, (str,), "Must be a string (a UUID)."),
    (serializers.DateTimeField, (str,), "Must be a string (an ISO 8601 time)."),
    (serializers.DateField, (str,), "Must be a string (an ISO 8601 date)."),
    (serializers.ListField, (list,), "Must be an array."),
    (serializers.ListSerializer, (list,), "Must be an array."),
    (serializers.DictField, (dict,), "Must be an object."),
    (serializers.Serializer, (dict,), "Must be an object."),
)


def _rule(field) -> tuple[tuple[type, ...], str] | None:
    if isinstance(field, serializers.ChoiceField):
        kinds = {type(choice) for choice in field.choices}
        return (tuple(kinds), "Must be one of the choices.") if kinds else None
    for cls, kinds, message in _RULES:
        if isinstance(field, cls):
            return kinds, message
    return None


def _matches(value, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in kinds:
        return False  # JSON true is not the number 1
    return isinstance(value, kinds)


def type_errors(field, value):
    """The error detail (DRF's nested shape) of `value` for `field`, or None."""
    if value is None:
        return None
    rule = _rule(field)
    if rule is not None and not _matches(value, rule[0]):
        return [rule[1]]
    limit = getattr(field, "max_length", None)
    if isinstance(field, serializers.CharField) and limit is not None and len(value) > limit:
        # As sent: DRF would measure it after trimming the blanks around it.
        return [f"Ensure this field has no more than {limit} characters."]
    if isinstance(field, serializers.Serializer) and isinstance(value, dict):
        return fields_type_errors(field.fields, value)
    child = getattr(field, "child", None)
    if child is None:
        return None
    if isinstance(value, list):
        items = ((index, item) for index, item in enumerate(value))
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, item in items:
        detail = type_errors(child, item)
        if detail:
            return {key: detail}
    return None


def fields_type_errors(fields, data) -> dict | None:
    """The first field of `data` (a parsed JSON object) whose value has the wrong JSON
    type, as {name: detail}; None if there is none (or `data` is not an object)."""
    if not isinstance(data, dict):
        return None
    for name, field in fields.items():
        if field.read_only or name not in data:
            continue
        detail = type_errors(field, data[name])
        if detail:
            return {name: detail}
    return None


@cache
def _declared_fields(serializer_class):
    return serializer_class().fields


def check_json_types(serializer_class, data) -> None:
    """Raise a 400 (ValidationError naming the field) if a value of `data` has another
    JSON type than `serializer_class` declares for it. The fields are built once."""
    errors = fields_type_errors(_declared_fields(serializer_class), data)
    if errors:
        raise serializers.ValidationError(errors)


# For a request serializer: refuse values of the wrong JSON type (module docstring) before
# DRF's fields coerce them. (No docstring: drf-spectacular would describe every serializer
# that mixes it in with it.)
class StrictJSONTypesMixin:
    def to_internal_value(self, data):
        errors = fields_type_errors(self.fields, data)
        if errors:
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)
