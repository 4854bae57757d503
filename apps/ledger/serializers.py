from rest_framework import serializers

from apps.ledger import selectors
from apps.ledger.models import BucketKind, Budget, BudgetMode, BudgetPeriod, Entry

MAX_AMOUNT = 2**62  # far beyond any grant; keeps arithmetic within BIGINT


class GrantRequestSerializer(serializers.Serializer):
    org = serializers.UUIDField()
    project = serializers.UUIDField(required=False, allow_null=True)
    amount = serializers.IntegerField(min_value=1, max_value=MAX_AMOUNT)
    kind = serializers.ChoiceField(choices=BucketKind.choices)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class BucketSerializer(serializers.Serializer):
    """A bucket as POST /v1/credits/grants answers it."""

    id = serializers.UUIDField()
    org = serializers.UUIDField(source="org_id")
    project = serializers.UUIDField(source="project_id", allow_null=True)
    kind = serializers.CharField()
    amount = serializers.IntegerField(source="granted")
    remaining = serializers.IntegerField()
    held = serializers.IntegerField()
    consumed = serializers.IntegerField()
    expired = serializers.IntegerField()
    expires_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class BudgetRequestSerializer(serializers.Serializer):
    org = serializers.UUIDField()
    project = serializers.UUIDField(required=False, allow_null=True)
    user = serializers.UUIDField(required=False, allow_null=True)
    limit = serializers.IntegerField(min_value=0, max_value=MAX_AMOUNT)
    period = serializers.ChoiceField(choices=BudgetPeriod.choices)
    mode = serializers.ChoiceField(choices=BudgetMode.choices)


class BudgetSerializer(serializers.ModelSerializer):
    """A budget (its first lane) with held and consumed added up over its lanes."""

    held = serializers.IntegerField(read_only=True)
    consumed = serializers.IntegerField(read_only=True)

    def to_representation(self, budget):
        body = super().to_representation(budget)
        body["held"], body["consumed"] = selectors.budget_usage(budget)  # one query
        return body

    class Meta:
        model = Budget
        fields = [
            "id",
            "org",
            "project",
            "user",
            "limit",
            "period",
            "mode",
            "held",
            "consumed",
            "period_start",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class BalanceBucketSerializer(serializers.Serializer):
    """A grant: its lanes (Bucket.lane_of) added up, under the first lane's id."""

    id = serializers.UUIDField()
    kind = serializers.CharField(source="bucket.kind")
    project = serializers.UUIDField(source="bucket.project_id", allow_null=True)
    remaining = serializers.IntegerField()
    held = serializers.IntegerField()
    expires_at = serializers.DateTimeField(source="bucket.expires_at", allow_null=True)


class ExpiringBucketSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    kind = serializers.CharField(source="bucket.kind")
    remaining = serializers.IntegerField()
    expires_at = serializers.DateTimeField(source="bucket.expires_at")


class ByKindSerializer(serializers.Serializer):
    paid = serializers.IntegerField()
    promo = serializers.IntegerField()
    grant = serializers.IntegerField()


class BalanceSerializer(serializers.Serializer):
    org = serializers.UUIDField(source="org.id")
    project = serializers.UUIDField(source="project.id", allow_null=True, default=None)
    available = serializers.IntegerField()
    held = serializers.IntegerField()
    total = serializers.IntegerField()
    by_kind = ByKindSerializer()
    buckets = BalanceBucketSerializer(many=True)
    expiring_soon = ExpiringBucketSerializer(many=True)
    as_of = serializers.DateTimeField()


class EntrySerializer(serializers.ModelSerializer):
    transaction = serializers.UUIDField(source="txn")
    # The grant's bucket, as GET /v1/balance lists it (a lane is internal striping).
    bucket = serializers.UUIDField(source="grant_id")
    job = serializers.UUIDField(source="job_id", allow_null=True)

    class Meta:
        model = Entry
        fields = [
            "id",
            "transaction",
            "kind",
            "account",
            "counter_account",
            "amount",
            "bucket",
            "hold",
            "job",
            "idempotency_key",
            "usage_until",
            "memo",
            "created_at",
        ]
        read_only_fields = fields
