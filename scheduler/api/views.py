"""Catalog API: GPU models with their specifications and prices."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets

from portal.api.schema import PortalAutoSchema
from scheduler.api.serializers import GpuModelSerializer
from scheduler.estimates import rates_now
from scheduler.models import PRECISIONS, GpuModel
from scheduler.selectors import CatalogFilter, gpu_model_list


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter(
                "min_memory_gb",
                {"type": "integer", "minimum": 0, "maximum": 10_000},
                description="At least this much.",
            ),
            OpenApiParameter("precision", OpenApiTypes.STR, enum=list(PRECISIONS)),
        ]
    )
)
class GpuModelViewSet(viewsets.ReadOnlyModelViewSet):  # type: ignore[type-arg]
    schema = PortalAutoSchema()
    serializer_class = GpuModelSerializer
    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9_-]+"
    pagination_class = None

    def get_queryset(self) -> QuerySet[GpuModel]:
        filters = (
            CatalogFilter.parse(self.request.query_params.dict()) if self.action == "list" else None
        )
        return gpu_model_list(filters=filters)

    def get_serializer_context(self) -> dict[str, Any]:
        """Every model's charged rate in one read of the price list."""
        return {**super().get_serializer_context(), "rates": rates_now(GpuModel.objects.all())}
