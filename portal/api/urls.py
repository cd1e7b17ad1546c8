from django.urls import include, path

from portal.api import views
from portal.api.routers import OptionalSlashRouter

router = OptionalSlashRouter()
router.register("tokens", views.ApiTokenViewSet, basename="api-token")

members = OptionalSlashRouter()
members.register("members", views.MembershipViewSet, basename="api-project-member")

urlpatterns = [
    path("", include(router.urls)),
    path("projects/<slug:project_slug>/", include(members.urls)),
]
