from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from apps.core.schema import example
from apps.core.serializers import StrictJSONTypesMixin
from apps.ledger import selectors
from apps.ledger.models import BucketKind, Budget, BudgetMode, BudgetPeriod, Entry

MAX_AMOUNT = 2**62  # far beyond any grant; keeps arithmetic within BIGINT

# Ids and times of the examples (opaque strings, UUIDs today).
ORG_ID = "0b6f1d1e-6c55-4d5e-9f1a-3c2b7f9e8a10"
PROJECT_ID = "5c9a2f44-1b7e-4c1f-8d7b-2e6f0a9c4d21"
BUCKET_ID = "3d5b8c1a-9e2f-4b7d-a6c0-1f4e8d2b9a54"
BUDGET_ID = "6a2e9f0c-3b8d-4e1a-9c5f-7d4b1a0e8c65"
HOLD_ID = "9f1c4e7a-2d6b-4a8e-b3f0-5c9d2e1a7b76"
JOB_ID = "4e8b2c6d-0a1f-4d3e-8b7c-9a5f1e2d6c87"
TXN_ID = "1a7d3f9b-5c2e-4e8a-a0d6-3b9c7f1e4d98"
AT = "2026-01-15T09:30:00Z"


@extend_schema_serializer(
    component_name="Grant",  # GrantRequest, as a request body
    examples=[
        example(
            "100 paid credits",
            {"org": ORG_ID, "amount": 100_000_000, "kind": "paid"},
            request=True,
        ),
        example(
            "A promotion for a project, expiring",
            {
                "org": ORG_ID,
                "project": PROJECT_ID,
                "amount": 5_000_000,
                "kind": "promo",
                "expires_at": "2026-12-31T23:59:59Z",
            },
            request=True,
        ),
    ],
)
class GrantRequestSerializer(StrictJSONTypesMixin, serializers.Serializer):
    org = serializers.UUIDField()
    project = serializers.UUIDField(required=False, allow_null=True)
    amount = serializers.IntegerField(min_value=1, max_value=MAX_AMOUNT)
    kind = serializers.ChoiceField(choices=BucketKind.choices)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


@extend_schema_serializer(
    examples=[
        example(
            "A new bucket",
            {
                "id": BUCKET_ID,
                "org": ORG_ID,
                "project": None,
                "kind": "paid",
                "amount": 100_000_000,
                "remaining": 100_000_000,
                "held": 0,
                "consumed": 0,
                "expired": 0,
                "expires_at": None,
                "created_at": AT,
            },
            response=True,
        )
    ]
)
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


@extend_schema_serializer(
    component_name="Budget",  # BudgetRequest, as a request body
    examples=[
        example(
            "A hard monthly budget of 500 credits",
            {"org": ORG_ID, "limit": 500_000_000, "period": "month", "mode": "hard"},
            request=True,
        )
    ],
)
class BudgetRequestSerializer(StrictJSONTypesMixin, serializers.Serializer):
    org = serializers.UUIDField()
    project = serializers.UUIDField(required=False, allow_null=True)
    user = serializers.UUIDField(required=False, allow_null=True)
    limit = serializers.IntegerField(min_value=0, max_value=MAX_AMOUNT)
    period = serializers.ChoiceField(choices=BudgetPeriod.choices)
    mode = serializers.ChoiceField(choices=BudgetMode.choices)


@extend_schema_serializer(
    examples=[
        example(
            "A budget",
            {
                "id": BUDGET_ID,
                "org": ORG_ID,
                "project": None,
                "user": None,
                "limit": 500_000_000,
                "period": "month",
                "mode": "hard",
                "held": 2_400_000,
                "consumed": 31_000_000,
                "period_start": "2026-01-01T00:00:00Z",
                "created_at": AT,
                "updated_at": AT,
            },
            response=True,
        )
    ]
)
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


@extend_schema_serializer(
    examples=[
        example(
            "A balance",
            {
                "org": ORG_ID,
                "project": None,
                "available": 97_600_000,
                "held": 2_400_000,
                "total": 100_000_000,
                "by_kind": {"paid": 95_000_000, "promo": 5_000_000, "grant": 0},
                "buckets": [
                    {
                        "id": BUCKET_ID,
                        "kind": "paid",
                        "project": None,
                        "remaining": 95_000_000,
                        "held": 2_400_000,
                        "expires_at": None,
                    }
                ],
                "expiring_soon": [],
                "as_of": AT,
            },
            response=True,
        )
    ]
)
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


@extend_schema_serializer(
    examples=[
        example(
            "A hold",
            {
                "id": 1042,
                "transaction": TXN_ID,
                "kind": "hold",
                "account": "held",
                "counter_account": "available",
                "amount": 2_400_000,
                "bucket": BUCKET_ID,
                "hold": HOLD_ID,
                "job": JOB_ID,
                "idempotency_key": "hold:9f1c4e7a",
                "usage_until": None,
                "memo": "",
                "created_at": AT,
            },
            response=True,
        )
    ]
)
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
