"""GET /v1/audit: the operators' merged audit trail (apps.audit.selectors)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from apps.accounts.models import Org
from apps.accounts.permissions import IsOperator
from apps.audit.selectors import (
    KINDS,
    MAX_LIMIT,
    AuditCursor,
    AuditFilters,
    audit_page,
    parse_kinds,
)
from apps.core.views import GenericAPIView
from apps.jobs.models import Job


class AuditQuerySerializer(serializers.Serializer):
    org = serializers.UUIDField(required=False)
    job = serializers.UUIDField(required=False)
    since = serializers.DateTimeField(required=False, help_text="ISO 8601; inclusive.")
    until = serializers.DateTimeField(required=False, help_text="ISO 8601; exclusive.")
    kind = serializers.CharField(required=False, allow_blank=True)
    cursor = serializers.CharField(required=False)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=MAX_LIMIT)

    def validate_org(self, value):
        if not Org.objects.filter(pk=value).exists():
            raise serializers.ValidationError(f"No org with id {value}.")
        return value

    def validate_job(self, value):
        if not Job.objects.filter(pk=value).exists():
            raise serializers.ValidationError(f"No job with id {value}.")
        return value

    def validate(self, attrs):
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None and until <= since:
            raise serializers.ValidationError({"until": "until must be later than since."})
        return attrs


class AuditItemSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="source:row id, unique on the timeline.")
    at = serializers.DateTimeField()
    source = serializers.ChoiceField(choices=["operator", "dispatch", "job", "ledger"])
    kind = serializers.CharField(help_text="source.subkind, e.g. dispatch.preempt.")
    org = serializers.UUIDField(source="org_id", allow_null=True)
    job = serializers.UUIDField(source="job_id", allow_null=True)
    actor = serializers.CharField()
    summary = serializers.CharField()
    reason = serializers.CharField()
    data = serializers.DictField()


class AuditPageSerializer(serializers.Serializer):
    results = AuditItemSerializer(many=True)
    next = serializers.CharField(allow_null=True, help_text="Cursor of the next (older) page.")


class AuditTrailView(GenericAPIView):
    """Every credit and scheduling decision, newest first: ledger entries, job events,
    dispatch decisions (placements, preemptions, reservations) and operator actions."""

    permission_classes = [IsOperator]
    serializer_class = AuditItemSerializer
    pagination_class = None

    @extend_schema(
        parameters=[
            OpenApiParameter("org", str, description="Only this org's rows."),
            OpenApiParameter("job", str, description="Only rows about this job."),
            OpenApiParameter("since", str, description="ISO 8601, inclusive."),
            OpenApiParameter("until", str, description="ISO 8601, exclusive."),
            OpenApiParameter(
                "kind",
                str,
                description="Comma-separated sources or kinds: " + ", ".join(KINDS[:4]) + ", "
                "or e.g. dispatch.preempt, job.failed, ledger.settle, operator.node.drain.",
            ),
            OpenApiParameter("cursor", str),
            OpenApiParameter("limit", int, description=f"1 to {MAX_LIMIT} (default 50)."),
        ],
        responses=AuditPageSerializer,
    )
    def get(self, request):
        query = AuditQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        filters = AuditFilters(
            org_id=params.get("org"),
            job_id=params.get("job"),
            since=params.get("since"),
            until=params.get("until"),
            kinds=parse_kinds(params.get("kind")),
        )
        cursor = AuditCursor.decode(params["cursor"]) if params.get("cursor") else None
        page = audit_page(filters=filters, cursor=cursor, limit=params.get("limit", 50))
        return Response(
            {
                "results": AuditItemSerializer(page.items, many=True).data,
                "next": page.next_cursor.encode() if page.next_cursor else None,
            }
        )
