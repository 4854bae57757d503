"""The operator's fleet API: list, add, drain, undrain and remove nodes; GPU types and
their prices.

Changes go through apps.fleet.operations, which records them in the audit trail
(actor `api:<key prefix>`) in the change's transaction; a refused call records nothing."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response

from apps.accounts.operator_actions import api_operator
from apps.accounts.permissions import IsOperator
from apps.core.errors import GantryError
from apps.core.idempotency import idempotent
from apps.core.pagination import OpaqueCursorPagination
from apps.core.schema import also_answers, idempotency_parameter
from apps.core.views import GenericAPIView
from apps.fleet import operations
from apps.fleet.models import Node, NodeState
from apps.scheduler import selectors
from apps.scheduler.serializers import (
    GPU_TYPE_NAME_SCHEMA,
    GpuTypePageSerializer,
    GpuTypeSerializer,
    GpuTypeSetSerializer,
    NodeCreateSerializer,
    NodeSerializer,
)


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
        operation_id="fleet_nodes_list",
        summary="List the fleet's nodes (operator)",
        description="By name, with their GPUs and what holds each.",
        parameters=[OpenApiParameter("state", enum=NodeState.values, required=False)],
        responses={200: NodeSerializer(many=True)},
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

    @extend_schema(
        operation_id="fleet_nodes_create",
        summary="Add a node (operator)",
        description="409 when a node has that name already.",
        request=NodeCreateSerializer,
        parameters=[idempotency_parameter()],
        responses={201: NodeSerializer},
    )
    @idempotent()
    def post(self, request):
        serializer = NodeCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        node = operations.add_node(**api_operator(request), **serializer.validated_data)
        return Response(_node_body(node), status=status.HTTP_201_CREATED)


class NodeDetailView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = NodeSerializer

    @extend_schema(operation_id="fleet_nodes_retrieve", summary="Read a node (operator)")
    def get(self, request, name):
        return Response(_node_body(_existing(name)))

    @also_answers(409)
    @extend_schema(
        operation_id="fleet_nodes_remove",
        summary="Remove a node (operator)",
        description="Only when none of its GPUs is in use (409 otherwise: drain it first). A "
        "node that ran jobs is kept as `down`, with its history.",
        responses={204: None},
    )
    def delete(self, request, name):
        operations.remove_node(**api_operator(request), name=name)
        return Response(status=status.HTTP_204_NO_CONTENT)


class NodeDrainView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = NodeSerializer

    @also_answers(409)
    @extend_schema(
        operation_id="fleet_nodes_drain",
        summary="Drain a node (operator)",
        description="It takes no new work; what runs there finishes. A removed node: 409.",
        request=None,
    )
    def post(self, request, name):
        return Response(_node_body(operations.drain_node(**api_operator(request), name=name)))


class NodeUndrainView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = NodeSerializer

    @extend_schema(
        operation_id="fleet_nodes_undrain",
        summary="Undrain a node (operator)",
        description="It takes work again (a removed node comes back).",
        request=None,
    )
    def post(self, request, name):
        return Response(_node_body(operations.undrain_node(**api_operator(request), name=name)))


class GpuTypeListView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = GpuTypeSerializer
    pagination_class = None

    @extend_schema(
        operation_id="fleet_gpu_types_list",
        summary="List GPU types (operator)",
        description="With memory, price per GPU-hour and how many GPUs are free; one page.",
        responses={200: GpuTypePageSerializer},
    )
    def get(self, request):
        rows = GpuTypeSerializer(selectors.gpu_types_with_counts(), many=True).data
        return Response({"results": rows, "next": None})


class GpuTypeDetailView(GenericAPIView):
    permission_classes = [IsOperator]
    serializer_class = GpuTypeSerializer

    @extend_schema(
        operation_id="fleet_gpu_types_set",
        summary="Add a GPU type or change its price (operator)",
        description="Creates the type (201; `memory_gb` required) or changes its price "
        "and, when given, its memory (200). Prices apply to placements from now on: a "
        "running attempt keeps the price it was placed at. Recorded as gpu_type.update "
        "with the values before and after. A name of 1 to 32 letters, digits, '.', '_' "
        "and '-', starting alphanumeric; a price of 0 to 10^12 micro-credits per GPU-hour.",
        parameters=[
            OpenApiParameter("name", GPU_TYPE_NAME_SCHEMA, OpenApiParameter.PATH),
            idempotency_parameter(),
        ],
        request=GpuTypeSetSerializer,
        responses={200: GpuTypeSerializer, 201: GpuTypeSerializer},
    )
    @idempotent()
    def put(self, request, name):
        body = GpuTypeSetSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        change = operations.set_gpu_type(**api_operator(request), name=name, **body.validated_data)
        [described] = selectors.gpu_types_with_counts(name=change.gpu_type.name)
        return Response(
            GpuTypeSerializer(described).data,
            status=status.HTTP_201_CREATED if change.created else status.HTTP_200_OK,
        )
