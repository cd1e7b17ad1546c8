"""Billing API: usage and cost, budgets, invoices, job cost, prices. Thin: parse, call, serialize."""

from __future__ import annotations

from django.conf import settings
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import selectors, services
from billing.api.serializers import (
    BudgetSerializer,
    BudgetWriteSerializer,
    InvoiceDetailSerializer,
    InvoiceSerializer,
    JobCostSerializer,
    PriceSerializer,
    StoragePriceSerializer,
    UsageSummarySerializer,
)
from billing.models import Invoice, PriceVersion, StoragePrice
from portal.api.schema import PortalAutoSchema, StrictLimitOffsetPagination
from portal.errors import NotFound
from portal.models import User
from portal.selectors import project_get_visible
from scheduler.selectors import job_get_visible

MONTH = OpenApiParameter("month", OpenApiTypes.STR, description="YYYY-MM (default: this month).")


def _user(request: Request) -> User:
    return request.user  # type: ignore[return-value]


class ProjectUsageView(APIView):
    """A project's usage and cost for a month: by model, job and day, with a forecast."""

    schema = PortalAutoSchema()

    @extend_schema(parameters=[MONTH], responses=UsageSummarySerializer)
    def get(self, request: Request, slug: str) -> Response:
        project = project_get_visible(user=_user(request), slug=slug)
        period = selectors.month_param(request.query_params.get("month"))
        summary = selectors.usage_summary(project=project, period_start=period)
        return Response(UsageSummarySerializer(summary).data)


class ProjectBudgetView(APIView):
    """Everyone in the project reads the budget; owners set or remove it."""

    schema = PortalAutoSchema()

    @extend_schema(responses=BudgetSerializer)
    def get(self, request: Request, slug: str) -> Response:
        project = project_get_visible(user=_user(request), slug=slug)
        budget = selectors.budget_of(project=project)
        if budget is None:
            raise NotFound("This project has no budget.")
        return Response(BudgetSerializer(budget).data)

    @extend_schema(request=BudgetWriteSerializer, responses=BudgetSerializer)
    def put(self, request: Request, slug: str) -> Response:
        project = project_get_visible(user=_user(request), slug=slug)
        body = BudgetWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        budget = services.budget_set(actor=_user(request), project=project, **body.validated_data)
        return Response(BudgetSerializer(budget).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, slug: str) -> Response:
        project = project_get_visible(user=_user(request), slug=slug)
        services.budget_remove(actor=_user(request), project=project)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProjectInvoiceListView(generics.ListAPIView):  # type: ignore[type-arg]
    schema = PortalAutoSchema()
    pagination_class = StrictLimitOffsetPagination
    serializer_class = InvoiceSerializer

    def get_queryset(self) -> QuerySet[Invoice]:
        project = project_get_visible(user=_user(self.request), slug=self.kwargs["slug"])
        return selectors.invoice_list_for_project(project=project)


class InvoiceDetailView(APIView):
    schema = PortalAutoSchema()

    @extend_schema(responses=InvoiceDetailSerializer)
    def get(self, request: Request, invoice_id: int) -> Response:
        invoice = selectors.invoice_get_visible(user=_user(request), invoice_id=invoice_id)
        return Response(InvoiceDetailSerializer(invoice).data)


class JobCostView(APIView):
    schema = PortalAutoSchema()

    @extend_schema(responses=JobCostSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        job = job_get_visible(user=_user(request), job_id=job_id)
        data = {
            "job_id": job.pk,
            "cost": selectors.job_cost(job),
            "currency": settings.BILLING_CURRENCY,
        }
        return Response(JobCostSerializer(data).data)


class PriceListView(generics.ListAPIView):  # type: ignore[type-arg]
    """Prices in effect now for each GPU model, and scheduled changes."""

    schema = PortalAutoSchema()
    serializer_class = PriceSerializer
    pagination_class = None

    def get_queryset(self) -> list[PriceVersion]:  # type: ignore[override]
        return selectors.price_list()


class StoragePriceListView(generics.ListAPIView):  # type: ignore[type-arg]
    """The storage price per GB-month in effect now, and scheduled changes (operators publish
    new versions in the admin; one in effect is never edited)."""

    schema = PortalAutoSchema()
    serializer_class = StoragePriceSerializer
    pagination_class = None

    def get_queryset(self) -> list[StoragePrice]:  # type: ignore[override]
        return selectors.storage_price_list()
