from django.urls import path

from storage import views

app_name = "storage"

urlpatterns = [
    path("projects/<slug:slug>/storage/", views.project_storage, name="project-storage"),
    path(
        "projects/<slug:slug>/storage/<int:volume_id>/",
        views.volume_detail,
        name="volume-detail",
    ),
    path(
        "projects/<slug:slug>/storage/<int:volume_id>/delete/",
        views.volume_delete,
        name="volume-delete",
    ),
    path(
        "projects/<slug:slug>/storage/request/",
        views.storage_request_new,
        name="storage-request-new",
    ),
    path("ops/storage/", views.ops_storage, name="ops-storage"),
    path("ops/storage/<slug:slug>/quota/", views.ops_storage_quota, name="ops-storage-quota"),
    path(
        "ops/storage/requests/<int:request_id>/decide/",
        views.ops_storage_request_decide,
        name="ops-storage-request-decide",
    ),
]
