from django.urls import include, path

from portal.api.routers import OptionalSlashRouter
from storage.api import views

volumes = OptionalSlashRouter()
volumes.register("volumes", views.VolumeViewSet, basename="api-volume")
volumes.register("storage/requests", views.StorageRequestViewSet, basename="api-storage-request")

urlpatterns = [
    path("projects/<slug:project_slug>/", include(volumes.urls)),
    path(
        "projects/<slug:project_slug>/storage",
        views.StorageQuotaView.as_view(),
        name="api-storage-quota",
    ),
    path(
        "storage/requests/<int:request_id>/decide",
        views.StorageRequestDecideView.as_view(),
        name="api-storage-request-decide",
    ),
]
