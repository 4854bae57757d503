"""Operator endpoints for tenancy, and read access for an org to its own objects.

Every change goes through apps.accounts.operations, which records it in the audit trail
(actor `api:<key prefix>`) in the change's transaction; a refused call records nothing."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from apps.accounts import operations, selectors
from apps.accounts.models import Org, Project, User
from apps.accounts.operator_actions import api_operator
from apps.accounts.permissions import IsOperator, IsOperatorForWrites
from apps.accounts.serializers import (
    APIKeyCreateSerializer,
    APIKeySerializer,
    IssuedAPIKeySerializer,
    OrgSerializer,
    OrgUpdateSerializer,
    ProjectSerializer,
    UserSerializer,
)
from apps.core.errors import GantryError
from apps.core.idempotency import idempotent
from apps.core.pagination import OpaqueCursorPagination
from apps.core.schema import also_answers, idempotency_parameter
from apps.core.views import GenericAPIView


class OrgListView(GenericAPIView):
    serializer_class = OrgSerializer
    permission_classes = [IsOperatorForWrites]
    pagination_class = OpaqueCursorPagination

    @extend_schema(
        operation_id="orgs_list",
        summary="List orgs",
        description="Operators: every org; an org key: its own.",
        responses={200: OrgSerializer(many=True)},
    )
    def get(self, request):
        page = self.paginate_queryset(selectors.visible_orgs(request.user).order_by("-created_at"))
        return self.get_paginated_response(OrgSerializer(page, many=True).data)

    @also_answers(409)
    @extend_schema(
        operation_id="orgs_create",
        summary="Create an org (operator)",
        description="409 when an org has that name already.",
        parameters=[idempotency_parameter()],
        responses={201: OrgSerializer},
    )
    @idempotent()
    def post(self, request):
        serializer = OrgSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        org = operations.create_org(**api_operator(request), **serializer.validated_data)
        return Response(OrgSerializer(org).data, status=status.HTTP_201_CREATED)


class OrgDetailView(GenericAPIView):
    serializer_class = OrgSerializer
    permission_classes = [IsOperatorForWrites]

    @extend_schema(operation_id="orgs_retrieve", summary="Read an org")
    def get(self, request, org):
        return Response(OrgSerializer(selectors.org_for(request.user, org)).data)

    @also_answers(409)
    @extend_schema(
        operation_id="orgs_update",
        summary="Change an org's settings (operator)",
        description="Tier, weight, rate and queue limits, dedup; 409 when renamed to a taken name.",
        request=OrgUpdateSerializer,
        responses={200: OrgSerializer},
    )
    def patch(self, request, org):
        instance = selectors.org_for(request.user, org)
        serializer = OrgUpdateSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        org = operations.update_org(instance, **api_operator(request), **serializer.validated_data)
        return Response(OrgSerializer(org).data)


class ProjectListView(GenericAPIView):
    serializer_class = ProjectSerializer
    permission_classes = [IsOperatorForWrites]
    pagination_class = OpaqueCursorPagination

    @extend_schema(
        operation_id="orgs_projects_list",
        summary="List an org's projects",
        responses={200: ProjectSerializer(many=True)},
    )
    def get(self, request, org):
        page = self.paginate_queryset(selectors.projects_of(selectors.org_for(request.user, org)))
        return self.get_paginated_response(ProjectSerializer(page, many=True).data)

    @also_answers(409)
    @extend_schema(
        operation_id="orgs_projects_create",
        summary="Create a project (operator)",
        description="409 when the org has a project of that name already.",
        parameters=[idempotency_parameter()],
        responses={201: ProjectSerializer},
    )
    @idempotent()
    def post(self, request, org):
        owner = selectors.org_for(request.user, org)
        serializer = ProjectSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = operations.create_project(
            org=owner, **api_operator(request), **serializer.validated_data
        )
        return Response(ProjectSerializer(project).data, status=status.HTTP_201_CREATED)


class UserListView(GenericAPIView):
    serializer_class = UserSerializer
    permission_classes = [IsOperatorForWrites]
    pagination_class = OpaqueCursorPagination

    @extend_schema(
        operation_id="orgs_users_list",
        summary="List an org's users",
        responses={200: UserSerializer(many=True)},
    )
    def get(self, request, org):
        page = self.paginate_queryset(selectors.users_of(selectors.org_for(request.user, org)))
        return self.get_paginated_response(UserSerializer(page, many=True).data)

    @also_answers(409)
    @extend_schema(
        operation_id="orgs_users_create",
        summary="Create a user (operator)",
        description="409 when the org has a user of that name already.",
        parameters=[idempotency_parameter()],
        responses={201: UserSerializer},
    )
    @idempotent()
    def post(self, request, org):
        owner = selectors.org_for(request.user, org)
        serializer = UserSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = operations.create_user(
            org=owner, **api_operator(request), **serializer.validated_data
        )
        return Response(UserSerializer(user).data, status=status.HTTP_201_CREATED)


class APIKeyListView(GenericAPIView):
    serializer_class = APIKeySerializer
    permission_classes = [IsOperatorForWrites]
    pagination_class = OpaqueCursorPagination

    @extend_schema(
        operation_id="api_keys_list",
        summary="List API keys",
        description="Operators: every key; an org key: its org's (a project key: its "
        "project's). The raw key is never shown again.",
        responses={200: APIKeySerializer(many=True)},
    )
    def get(self, request):
        page = self.paginate_queryset(selectors.visible_api_keys(request.user))
        return self.get_paginated_response(APIKeySerializer(page, many=True).data)

    @extend_schema(
        operation_id="api_keys_create",
        summary="Issue an API key (operator)",
        description="`key` is shown in this answer only (a replay answers without it). "
        "An org key names `org` (and optionally a `project` and `user` of it); an operator "
        "key sets `operator` and names no org. A referenced id that does not exist is a 400 "
        "naming it.",
        request=APIKeyCreateSerializer,
        parameters=[idempotency_parameter()],
        responses={201: IssuedAPIKeySerializer},
    )
    @idempotent(secret_fields=("key",))  # the raw key is shown once, never stored
    def post(self, request):
        serializer = APIKeyCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        org = project = user = None
        if data.get("org"):
            org = _or_400(Org, data["org"], "org")
        if data.get("project"):
            project = _or_400(Project, data["project"], "project")
        if data.get("user"):
            user = _or_400(User, data["user"], "user")
        issued = operations.issue_api_key(
            **api_operator(request),
            org=org,
            project=project,
            user=user,
            operator=data["operator"],
            name=data["name"],
        )
        body = APIKeySerializer(issued.api_key).data
        body["key"] = issued.raw_key
        return Response(body, status=status.HTTP_201_CREATED)


class APIKeyDetailView(GenericAPIView):
    serializer_class = APIKeySerializer
    permission_classes = [IsOperator]

    @extend_schema(
        operation_id="api_keys_revoke",
        summary="Revoke an API key (operator)",
        description="Answers the revoked key. Revocation reaches every API process within "
        "GANTRY_API_KEY_CACHE_S.",
        responses={200: APIKeySerializer},
    )
    def delete(self, request, key_id):
        api_key = get_object_or_404(selectors.visible_api_keys(request.user), pk=key_id)
        return Response(
            APIKeySerializer(operations.revoke_api_key(api_key, **api_operator(request))).data
        )


def _or_400(model, pk, field: str):
    """A referenced id in a body that does not exist is bad input (400), not a 404."""
    try:
        return model.objects.get(pk=pk)
    except model.DoesNotExist as exc:
        raise GantryError(f"No {field} with id {pk}.", code="invalid", field=field) from exc
