"""Monitoring API (mounted at /api/v1/monitoring/)."""

urlpatterns: list[object] = []
