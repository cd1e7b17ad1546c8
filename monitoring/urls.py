"""Monitoring pages (mounted at /monitoring/)."""

app_name = "monitoring"
urlpatterns: list[object] = []
