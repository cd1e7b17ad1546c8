from django.urls import path

from scheduler.agent_api import views

urlpatterns = [
    path("register", views.RegisterView.as_view(), name="agent-register"),
    path("heartbeat", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("assignments", views.AssignmentsView.as_view(), name="agent-assignments"),
    path("sync", views.SyncView.as_view(), name="agent-sync"),
    path("jobs/<int:job_id>/started", views.JobStartedView.as_view(), name="agent-job-started"),
    path("jobs/<int:job_id>/exited", views.JobExitedView.as_view(), name="agent-job-exited"),
    path("jobs/<int:job_id>/logs", views.JobLogsView.as_view(), name="agent-job-logs"),
]
