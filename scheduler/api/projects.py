"""Projects API: the projects you may see, each with its quota (admission's limits)."""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework import viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from portal.api.schema import PortalAutoSchema, StrictLimitOffsetPagination
from portal.api.serializers import ProjectSerializer
from portal.models import Project
from portal.selectors import project_list_visible_to, project_role_of
from scheduler.api.serializers import ProjectDetailSerializer
from scheduler.selectors import project_with_quota


class ProjectViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    schema = PortalAutoSchema()
    pagination_class = StrictLimitOffsetPagination
    lookup_field = "slug"
    lookup_value_regex = r"[a-z0-9-]+"

    def get_queryset(self) -> QuerySet[Project]:
        return project_list_visible_to(user=self.request.user)  # type: ignore[arg-type]

    def get_serializer_class(self) -> type:
        return ProjectDetailSerializer if self.action == "retrieve" else ProjectSerializer

    def retrieve(self, request: Request, slug: str | None = None) -> Response:
        project = project_with_quota(user=request.user, slug=slug or "")  # type: ignore[arg-type]
        role = project_role_of(user=request.user, project=project)  # type: ignore[arg-type]
        return Response(ProjectDetailSerializer(project, context={"role": role}).data)
