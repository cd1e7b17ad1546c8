"""Billing API (mounted at /api/v1/billing/)."""

urlpatterns: list[object] = []
