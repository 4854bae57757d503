"""Credit endpoints: balance and entries for an org, grants and budgets for operators.

Grants and budgets go through apps.ledger.operations, which records them in the audit
trail (actor `api:<key prefix>`) in the change's transaction; a refused call records
nothing."""

import uuid

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response

from apps.accounts import selectors as accounts
from apps.accounts.models import Org, Project, User
from apps.accounts.operator_actions import api_operator
from apps.accounts.permissions import IsOperator
from apps.core.errors import GantryError
from apps.core.idempotency import HEADER, idempotent
from apps.core.pagination import OldestFirstCursorPagination
from apps.core.schema import also_answers, idempotency_parameter
from apps.core.views import GenericAPIView
from apps.ledger import operations, selectors
from apps.ledger.serializers import (
    BalanceSerializer,
    BucketSerializer,
    BudgetRequestSerializer,
    BudgetSerializer,
    EntrySerializer,
    GrantRequestSerializer,
)

ORG_PARAM = OpenApiParameter(
    "org",
    OpenApiTypes.UUID,
    description="The org to read: required with an operator key (a 400 without it); an org "
    "key may name its own. Another org's, or one that does not exist: 404.",
)


def _caller_org(request) -> Org:
    """The caller's org; an operator names it with ?org= (another org's: 404)."""
    org_id = request.query_params.get("org")
    if request.user.is_operator and not org_id:
        raise GantryError("Operators must name the org with ?org=.", code="invalid", field="org")
    if not org_id:
        return request.user.org
    return accounts.org_for(request.user, _uuid_or_404(org_id))


def _uuid_or_404(value):
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise Http404 from exc


def _referenced(model, pk, field: str):
    """A body's reference to a missing object is bad input (400 naming the field)."""
    if pk is None:
        return None
    try:
        return model.objects.get(pk=pk)
    except model.DoesNotExist as exc:
        raise GantryError(f"No {field} with id {pk}.", code="invalid", field=field) from exc


class BalanceView(GenericAPIView):
    serializer_class = BalanceSerializer

    @also_answers(404)
    @extend_schema(
        operation_id="balance_retrieve",
        summary="The org's credit balance",
        description="What is available, held and in total, by kind, per bucket, and what "
        "expires soon; of one project with ?project= (a project key: its project's).",
        parameters=[
            OpenApiParameter(
                "project",
                str,
                description="Project id or name; unknown (or another project than a project "
                "key's): 404.",
            ),
            ORG_PARAM,
        ],
    )
    def get(self, request):
        org = _caller_org(request)
        project = self._project(request, org)
        return Response(BalanceSerializer(selectors.balance(org=org, project=project)).data)

    @staticmethod
    def _project(request, org):
        wanted = request.query_params.get("project")
        narrowed = None if request.user.is_operator else request.user.project_id
        if not wanted:
            return Project.objects.get(pk=narrowed) if narrowed else None
        projects = Project.objects.filter(org=org)
        try:
            project = projects.filter(pk=uuid.UUID(wanted)).first()
        except ValueError:
            project = projects.filter(name=wanted).first()
        if project is None or (narrowed and project.pk != narrowed):
            raise Http404
        return project


class EntryListView(GenericAPIView):
    """The org's ledger entries, oldest first (an append-only log is read forward)."""

    serializer_class = EntrySerializer
    pagination_class = OldestFirstCursorPagination

    @also_answers(404)
    @extend_schema(
        operation_id="ledger_entries_list",
        summary="The org's ledger entries",
        description="Append-only, oldest first; a project key reads its project's only (its "
        "jobs' holds and the grants bound to it).",
        parameters=[
            OpenApiParameter("job", OpenApiTypes.UUID, description="Only this job's entries."),
            ORG_PARAM,
        ],
        responses={200: EntrySerializer(many=True)},
    )
    def get(self, request):
        org = _caller_org(request)
        job = request.query_params.get("job")
        if job:
            try:
                job = uuid.UUID(job)
            except ValueError as exc:
                raise GantryError("job must be a job id.", code="invalid", field="job") from exc
        project_id = None if request.user.is_operator else request.user.project_id
        page = self.paginate_queryset(
            selectors.entries_of(org=org, job=job or None, project_id=project_id)
        )
        return self.get_paginated_response(EntrySerializer(page, many=True).data)


class GrantView(GenericAPIView):
    serializer_class = BucketSerializer
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="credits_grants_create",
        summary="Grant credits (operator)",
        description="A new bucket of `amount` micro-credits for the org (or one project of "
        "it). The same Idempotency-Key never grants twice.",
        request=GrantRequestSerializer,
        parameters=[idempotency_parameter(required=True)],
        responses={201: BucketSerializer},
    )
    @idempotent(required=True)
    def post(self, request):
        body = GrantRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        bucket = operations.grant(
            **api_operator(request),
            org=_referenced(Org, data["org"], "org"),
            project=_referenced(Project, data.get("project"), "project"),
            amount=data["amount"],
            kind=data["kind"],
            expires_at=data.get("expires_at"),
            idempotency_key=request.META[HEADER].strip(),
        )
        return Response(
            BucketSerializer(selectors.grant_totals(bucket)).data, status=status.HTTP_201_CREATED
        )


class BudgetView(GenericAPIView):
    serializer_class = BudgetSerializer
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="budgets_set",
        summary="Set a budget (operator)",
        description="Creates or replaces the budget at that level: the org, a project, a "
        "user, or a user in a project.",
        request=BudgetRequestSerializer,
        parameters=[idempotency_parameter()],
        responses={200: BudgetSerializer},
    )
    @idempotent()
    def put(self, request):
        body = BudgetRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        budget = operations.set_budget(
            **api_operator(request),
            org=_referenced(Org, data["org"], "org"),
            project=_referenced(Project, data.get("project"), "project"),
            user=_referenced(User, data.get("user"), "user"),
            limit=data["limit"],
            period=data["period"],
            mode=data["mode"],
        )
        return Response(BudgetSerializer(budget).data)
