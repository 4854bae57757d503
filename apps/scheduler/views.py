"""The operator's fleet API: list, add, drain, undrain and remove nodes; GPU types.

Changes go through apps.fleet.operations, which records them in the audit trail
(actor `api:<key prefix>`) in the change's transaction; a refused call records nothing."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from apps.accounts.operator_actions import api_operator
from apps.accounts.permissions import IsOperator
from apps.core.errors import GantryError
from apps.core.idempotency import idempotent
from apps.core.pagination import OpaqueCursorPagination
from apps.fleet import operations
from apps.fleet.models import Node, NodeState
from apps.scheduler import selectors
from apps.scheduler.serializers import GpuTypeSerializer, NodeCreateSerializer, NodeSerializer


class NodePagination(OpaqueCursorPagination):
    ordering = ("name",)


def _node_body(node: Node) -> dict:
    return NodeSerializer(selectors.describe_nodes([node])[0]).data


def _existing(name: str) -> Node:
    node = selectors.node_by_name(name)
    if node is None:
        raise GantryError(f"No node named {name!r}.", code="not_found", status_code=404)
    return node


class NodeListView(GenericAPIView):
    permission_classes = [IsOperator]
    pagination_class = NodePagination
    serializer_class = NodeSerializer

    @extend_schema(
        parameters=[OpenApiParameter("state", enum=NodeState.values, required=False)],
        responses=NodeSerializer(many=True),
    )
    def get(self, request):
        state = request.query_params.get("state") or None
        if state is not None and state not in NodeState.values:
            raise GantryError(
                f"state must be one of {', '.join(NodeState.values)}.",
                code="invalid",
                field="state",
            )
        page = self.paginate_queryset(selectors.nodes(state=state))
        return self.get_paginated_response(
            NodeSerializer(selectors.describe_nodes(page), many=True).data
        )

    @extend_schema(request=NodeCreateSerializer, responses={201: NodeSerializer})
    @idempotent()
    def post(self, request):
        serializer = NodeCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = operations.add_node(**api_operator(request), **serializer.validated_data)
        return Response(_node_body(node), status=status.HTTP_201_CREATED)


class NodeDetailView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = NodeSerializer

    def get(self, request, name):
        return Response(_node_body(_existing(name)))

    @extend_schema(responses={204: None})
    def delete(self, request, name):
        operations.remove_node(**api_operator(request), name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)


class NodeDrainView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = NodeSerializer

    @extend_schema(request=None)
    def post(self, request, name):
        return Response(_node_body(operations.drain_node(**api_operator(request), name=name)))


class NodeUndrainView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = NodeSerializer

    @extend_schema(request=None)
    def post(self, request, name):
        return Response(_node_body(operations.undrain_node(**api_operator(request), name=name)))


class GpuTypeListView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = GpuTypeSerializer
    pagination_class = None

    @extend_schema(responses=GpuTypeSerializer(many=True))
    def get(self, request):
        rows = GpuTypeSerializer(selectors.gpu_types_with_counts(), many=True).data
        return Response({"results": rows, "next": None})
