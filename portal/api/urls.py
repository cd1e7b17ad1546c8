from django.urls import include, path
from rest_framework.routers import SimpleRouter

from portal.api import views

router = SimpleRouter(trailing_slash="/?")  # type: ignore[arg-type]  # optional slash
router.register("projects", views.ProjectViewSet, basename="api-project")
router.register("tokens", views.ApiTokenViewSet, basename="api-token")

members = SimpleRouter(trailing_slash="/?")  # type: ignore[arg-type]  # optional slash
members.register("members", views.MembershipViewSet, basename="api-project-member")

urlpatterns = [
    path("", include(router.urls)),
    path("projects/<slug:project_slug>/", include(members.urls)),
]
