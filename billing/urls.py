"""Billing pages (mounted at /billing/)."""

from django.urls import path

from billing import views

app_name = "billing"
urlpatterns = [
    path("projects/<slug:slug>/usage/", views.usage, name="usage"),
    path("projects/<slug:slug>/budget/", views.budget_update, name="budget-update"),
    path("projects/<slug:slug>/invoices/", views.invoices, name="invoices"),
    path("projects/<slug:slug>/usage.csv", views.usage_csv, name="usage-csv"),
    path("projects/<slug:slug>/focus.csv", views.usage_focus, name="usage-focus"),
    path("invoices/<int:invoice_id>/", views.invoice_detail, name="invoice"),
    path("invoices/<int:invoice_id>/pdf/", views.invoice_pdf, name="invoice-pdf"),
    path("invoices/<int:invoice_id>/focus.csv", views.invoice_focus, name="invoice-focus"),
    path(
        "invoices/<int:invoice_id>/lines/<int:line_id>/",
        views.invoice_line,
        name="invoice-line",
    ),
    path(
        "projects/<slug:slug>/reservations/request/",
        views.reservation_request_new,
        name="reservation-request-new",
    ),
    path(
        "operator/reservation-requests/<int:request_id>/decide/",
        views.reservation_request_decide,
        name="reservation-request-decide",
    ),
    path("operator/revenue/", views.revenue, name="revenue"),
    path("operator/close/", views.month_close_page, name="month-close"),
    path("operator/close/<int:close_id>/", views.month_close_detail, name="month-close-detail"),
    path("stripe/webhook/", views.stripe_webhook, name="stripe-webhook"),
]
