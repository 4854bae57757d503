"""Operator endpoints for tenancy, and read access for an org to its own objects.

Every change goes through apps.accounts.operations, which records it in the audit trail
(actor `api:<key prefix>`) in the change's transaction; a refused call records nothing."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from apps.accounts import operations, selectors
from apps.accounts.models import Org, Project, User
from apps.accounts.operator_actions import api_operator
from apps.accounts.permissions import IsOperator, IsOperatorForWrites
from apps.accounts.serializers import (
    APIKeyCreateSerializer,
    APIKeySerializer,
    OrgSerializer,
    OrgUpdateSerializer,
    ProjectSerializer,
    UserSerializer,
)
from apps.core.errors import GantryError
from apps.core.idempotency import idempotent
from apps.core.pagination import OpaqueCursorPagination


class OrgListView(GenericAPIView):
    serializer_class = OrgSerializer
    permission_classes = [IsOperatorForWrites]
    pagination_class = OpaqueCursorPagination

    def get(self, request):
        page = self.paginate_queryset(selectors.visible_orgs(request.user).order_by("-created_at"))
        return self.get_paginated_response(OrgSerializer(page, many=True).data)

    @idempotent()
    def post(self, request):
        serializer = OrgSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        org = operations.create_org(**api_operator(request), **serializer.validated_data)
        return Response(OrgSerializer(org).data, status=status.HTTP_201_CREATED)


class OrgDetailView(GenericAPIView):
    serializer_class = OrgSerializer
    permission_classes = [IsOperatorForWrites]

    def get(self, request, org):
        return Response(OrgSerializer(selectors.org_for(request.user, org)).data)

    @extend_schema(request=OrgUpdateSerializer)
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

    def get(self, request, org):
        page = self.paginate_queryset(selectors.projects_of(selectors.org_for(request.user, org)))
        return self.get_paginated_response(ProjectSerializer(page, many=True).data)

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

    def get(self, request, org):
        page = self.paginate_queryset(selectors.users_of(selectors.org_for(request.user, org)))
        return self.get_paginated_response(UserSerializer(page, many=True).data)

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

    def get(self, request):
        page = self.paginate_queryset(selectors.visible_api_keys(request.user))
        return self.get_paginated_response(APIKeySerializer(page, many=True).data)

    @extend_schema(request=APIKeyCreateSerializer, responses={201: APIKeySerializer})
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
