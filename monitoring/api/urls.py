"""Monitoring API (mounted at /api/v1/monitoring/)."""

from django.urls import path

from monitoring.api import views

urlpatterns = [
    path("cluster", views.ClusterView.as_view(), name="api-monitoring-cluster"),
    path("alerts", views.AlertListView.as_view(), name="api-monitoring-alerts"),
    path(
        "notifications", views.NotificationListView.as_view(), name="api-monitoring-notifications"
    ),
    path(
        "jobs/<int:job_id>/series", views.JobSeriesView.as_view(), name="api-monitoring-job-series"
    ),
    path(
        "jobs/<int:job_id>/efficiency",
        views.JobEfficiencyView.as_view(),
        name="api-monitoring-job-efficiency",
    ),
    path(
        "projects/<slug:slug>/efficiency",
        views.ProjectEfficiencyView.as_view(),
        name="api-monitoring-project-efficiency",
    ),
    path(
        "nodes/<int:node_id>/series",
        views.NodeSeriesView.as_view(),
        name="api-monitoring-node-series",
    ),
]
