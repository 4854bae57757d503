from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from apps.accounts.models import APIKey, Org, Project, Tier, User
from apps.accounts.operations import ORG_SETTINGS
from apps.core.schema import example
from apps.core.serializers import StrictJSONTypesMixin

# Ids and times of the examples (opaque strings, UUIDs today).
ORG_ID = "0b6f1d1e-6c55-4d5e-9f1a-3c2b7f9e8a10"
PROJECT_ID = "5c9a2f44-1b7e-4c1f-8d7b-2e6f0a9c4d21"
USER_ID = "8e3d7a90-4f2b-4a6e-b1c5-9d0f2e7a6b32"
KEY_ID = "c2a8e6f1-7d3b-4e59-a0f4-6b1d9c8e2f43"
CREATED_AT = "2026-01-15T09:30:00Z"

ORG_EXAMPLE = {
    "id": ORG_ID,
    "name": "acme",
    "tier": "paid",
    "weight": 1.0,
    "max_queued_jobs": None,
    "max_running_jobs": None,
    "rate_per_s": None,
    "rate_burst": None,
    "dedup_enabled": False,
    "created_at": CREATED_AT,
}
PROJECT_EXAMPLE = {"id": PROJECT_ID, "org": ORG_ID, "name": "render", "created_at": CREATED_AT}
USER_EXAMPLE = {
    "id": USER_ID,
    "org": ORG_ID,
    "name": "alice",
    "weight": 1.0,
    "created_at": CREATED_AT,
}
API_KEY_EXAMPLE = {
    "id": KEY_ID,
    "name": "render pipeline",
    "prefix": "gk_3f9a1c2e",
    "is_operator": False,
    "org": ORG_ID,
    "project": PROJECT_ID,
    "user": None,
    "created_at": CREATED_AT,
    "revoked_at": None,
}


@extend_schema_serializer(
    examples=[
        example("A paid org", {"name": "acme", "tier": "paid", "weight": 1.0}, request=True),
        example("An org", ORG_EXAMPLE, response=True),
    ]
)
class OrgSerializer(StrictJSONTypesMixin, serializers.ModelSerializer):
    tier = serializers.ChoiceField(choices=Tier.choices)
    weight = serializers.FloatField(min_value=0.001, max_value=1_000_000, required=False)
    rate_per_s = serializers.FloatField(min_value=0.001, required=False, allow_null=True)

    class Meta:
        model = Org
        fields = ["id", *ORG_SETTINGS, "created_at"]
        read_only_fields = ["id", "created_at"]
        # Uniqueness is the service's job (409), not a validation error (400).
        extra_kwargs = {"name": {"validators": []}}


@extend_schema_serializer(
    examples=[
        example(
            "Enterprise, with a rate limit",
            {"tier": "enterprise", "rate_per_s": 5.0, "rate_burst": 20},
            request=True,
        ),
    ]
)
class OrgUpdateSerializer(OrgSerializer):
    tier = serializers.ChoiceField(choices=Tier.choices, required=False)

    class Meta(OrgSerializer.Meta):
        extra_kwargs = {"name": {"required": False, "validators": []}}


@extend_schema_serializer(
    examples=[
        example("A project", {"name": "render"}, request=True),
        example("A project", PROJECT_EXAMPLE, response=True),
    ]
)
class ProjectSerializer(StrictJSONTypesMixin, serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "org", "name", "created_at"]
        read_only_fields = ["id", "org", "created_at"]
        validators = []


@extend_schema_serializer(
    examples=[
        example("A user", {"name": "alice", "weight": 1.0}, request=True),
        example("A user", USER_EXAMPLE, response=True),
    ]
)
class UserSerializer(StrictJSONTypesMixin, serializers.ModelSerializer):
    weight = serializers.FloatField(min_value=0.001, max_value=1_000_000, required=False)

    class Meta:
        model = User
        fields = ["id", "org", "name", "weight", "created_at"]
        read_only_fields = ["id", "org", "created_at"]
        validators = []


@extend_schema_serializer(
    examples=[
        example(
            "A project key",
            {"org": ORG_ID, "project": PROJECT_ID, "name": "render pipeline"},
            request=True,
        ),
    ]
)
class APIKeyCreateSerializer(StrictJSONTypesMixin, serializers.Serializer):
    """An org key names its org (and optionally a project and a user of it); an operator
    key sets `operator` and names none."""

    # (No `enum` here: drf-spectacular's enum hook would turn them into shared components.)
    openapi_request_schema = {
        "oneOf": [
            {
                "title": "An org key",
                "required": ["org"],
                "properties": {
                    "org": {"type": "string", "format": "uuid"},
                    "operator": {"type": "boolean", "not": {"enum": [True]}},
                },
            },
            {
                "title": "An operator key",
                "required": ["operator"],
                "properties": {"operator": {"type": "boolean", "not": {"enum": [False]}}},
                "not": {
                    "anyOf": [
                        {"required": [name], "properties": {name: {"type": "string"}}}
                        for name in ("org", "project", "user")
                    ]
                },
            },
        ]
    }

    org = serializers.UUIDField(required=False, allow_null=True)
    project = serializers.UUIDField(required=False, allow_null=True)
    user = serializers.UUIDField(required=False, allow_null=True)
    operator = serializers.BooleanField(required=False, default=False)
    name = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


@extend_schema_serializer(examples=[example("A key", API_KEY_EXAMPLE, response=True)])
class APIKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = APIKey
        fields = [
            "id",
            "name",
            "prefix",
            "is_operator",
            "org",
            "project",
            "user",
            "created_at",
            "revoked_at",
        ]
        read_only_fields = fields


@extend_schema_serializer(
    examples=[
        example(
            "A new key",
            {**API_KEY_EXAMPLE, "key": "gk_3f9a1c2e_Qm2xR4vT9bW1nY6cK3pL8dF0sH5jA2eZt7uVw1yB4c"},
            response=True,
            status_codes=[201],
        )
    ]
)
class IssuedAPIKeySerializer(APIKeySerializer):
    """A key as issued: with the raw `key`, shown this once."""

    key = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="The raw key, shown this once: null in an answer that replays the first "
        "(the same Idempotency-Key and body).",
    )

    class Meta(APIKeySerializer.Meta):
        fields = [*APIKeySerializer.Meta.fields, "key"]
        read_only_fields = fields
