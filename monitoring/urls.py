"""Monitoring pages (mounted at /monitoring/)."""

from django.urls import path

from monitoring import views

app_name = "monitoring"
urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("alerts/", views.alert_list, name="alerts"),
    path("notifications/", views.notification_list, name="notifications"),
    path("notifications/read/", views.notifications_read, name="notifications-read"),
    path("efficiency/", views.efficiency, name="efficiency"),
    path("efficiency/<slug:slug>/", views.project_efficiency, name="project-efficiency"),
    path("jobs/<int:job_id>/efficiency/", views.job_efficiency, name="job-efficiency"),
    path("metrics", views.metrics_view, name="metrics"),
]
