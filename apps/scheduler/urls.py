from django.urls import path

from apps.scheduler import views

urlpatterns = [
    path("fleet/nodes", views.NodeListView.as_view(), name="fleet-nodes"),
    path("fleet/nodes/<str:name>", views.NodeDetailView.as_view(), name="fleet-node"),
    path("fleet/nodes/<str:name>/drain", views.NodeDrainView.as_view(), name="fleet-node-drain"),
    path(
        "fleet/nodes/<str:name>/undrain",
        views.NodeUndrainView.as_view(),
        name="fleet-node-undrain",
    ),
    path("fleet/gpu-types", views.GpuTypeListView.as_view(), name="fleet-gpu-types"),
    path("fleet/gpu-types/<str:name>", views.GpuTypeDetailView.as_view(), name="fleet-gpu-type"),
]
