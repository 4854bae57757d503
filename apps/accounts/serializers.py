from rest_framework import serializers

from apps.accounts.models import APIKey, Org, Project, Tier, User
from apps.accounts.operations import ORG_SETTINGS


class OrgSerializer(serializers.ModelSerializer):
    tier = serializers.ChoiceField(choices=Tier.choices)
    weight = serializers.FloatField(min_value=0.001, max_value=1_000_000, required=False)
    rate_per_s = serializers.FloatField(min_value=0.001, required=False, allow_null=True)

    class Meta:
        model = Org
        fields = ["id", *ORG_SETTINGS, "created_at"]
        read_only_fields = ["id", "created_at"]
        # Uniqueness is the service's job (409), not a validation error (400).
        extra_kwargs = {"name": {"validators": []}}


class OrgUpdateSerializer(OrgSerializer):
    tier = serializers.ChoiceField(choices=Tier.choices, required=False)

    class Meta(OrgSerializer.Meta):
        extra_kwargs = {"name": {"required": False, "validators": []}}


class ProjectSerializer(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = ["id", "org", "name", "created_at"]
        read_only_fields = ["id", "org", "created_at"]
        validators = []


class UserSerializer(serializers.ModelSerializer):
    weight = serializers.FloatField(min_value=0.001, max_value=1_000_000, required=False)

    class Meta:
        model = User
        fields = ["id", "org", "name", "weight", "created_at"]
        read_only_fields = ["id", "org", "created_at"]
        validators = []


class APIKeyCreateSerializer(serializers.Serializer):
    org = serializers.UUIDField(required=False, allow_null=True)
    project = serializers.UUIDField(required=False, allow_null=True)
    user = serializers.UUIDField(required=False, allow_null=True)
    operator = serializers.BooleanField(required=False, default=False)
    name = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


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
