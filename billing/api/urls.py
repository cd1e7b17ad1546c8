"""Billing API (mounted at /api/v1/billing/)."""

from django.urls import path

from billing.api import views

urlpatterns = [
    path("prices", views.PriceListView.as_view(), name="api-billing-prices"),
    path(
        "prices/storage",
        views.StoragePriceListView.as_view(),
        name="api-billing-storage-prices",
    ),
    path("projects/<slug:slug>/usage", views.ProjectUsageView.as_view(), name="api-billing-usage"),
    path(
        "projects/<slug:slug>/budget", views.ProjectBudgetView.as_view(), name="api-billing-budget"
    ),
    path(
        "projects/<slug:slug>/invoices",
        views.ProjectInvoiceListView.as_view(),
        name="api-billing-invoices",
    ),
    path(
        "invoices/<int:invoice_id>", views.InvoiceDetailView.as_view(), name="api-billing-invoice"
    ),
    path("jobs/<int:job_id>/cost", views.JobCostView.as_view(), name="api-billing-job-cost"),
]
