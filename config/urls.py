"""URL root: pages, the admin, the API and its schema and docs (the top layer: it may import every app)."""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from foundation.ratelimit import ratelimited
from monitoring.views import metrics_view
from portal import probes, views
from portal.forms import EmailLoginForm
from scheduler import ops_views
from scheduler import views as scheduler_views
from scheduler.backends.slurm import views as slurm_views
from web import events as web_events
from web import views as web_views


def _login_rate() -> str:
    return str(settings.LOGIN_RATE)


urlpatterns = [
    # The API first: Django tries the patterns in order, and the busiest requests (agents' syncs
    # and heartbeats, submissions) then skip the pages' patterns. No page path starts with api/.
    path("api/agent/v1/", include("scheduler.agent_api.urls")),
    path("api/v1/", include("portal.api.urls")),
    path("api/v1/", include("scheduler.api.urls")),
    path("api/v1/billing/", include("billing.api.urls")),
    path("api/v1/monitoring/", include("monitoring.api.urls")),
    path("api/v1/", include("storage.api.urls")),
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("", web_views.home, name="home"),
    # Pushed updates; in production the events service serves it (config/urls_events.py).
    path("events/", web_events.events, name="events"),
    path("events/agent", web_events.agent_watch, name="events-agent"),
    path(
        "login/",
        ratelimited("login", _login_rate, methods=("POST",), page=True)(
            auth_views.LoginView.as_view(authentication_form=EmailLoginForm)
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/reset/", views.PasswordResetView.as_view(), name="password_reset"),
    path(
        "password/reset/sent/",
        auth_views.PasswordResetDoneView.as_view(),
        name="password_reset_done",
    ),
    path(
        "password/reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path(
        "password/reset/done/",
        auth_views.PasswordResetCompleteView.as_view(),
        name="password_reset_complete",
    ),
    path("password/change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path(
        "password/change/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("signup/", views.signup, name="signup"),
    path("signup/<str:token>/", views.signup_verify, name="signup-verify"),
    path("account/", views.account, name="account"),
    path("account/two-factor/", views.two_factor_setup, name="two-factor-setup"),
    path("account/notifications/", views.notification_settings, name="notification-settings"),
    path("account/two-factor/verify/", views.two_factor_verify, name="two-factor-verify"),
    path("account/email/<str:token>/", views.email_change_confirm, name="email-change-confirm"),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation-accept"),
    path("projects/new/", views.project_new, name="project-new"),
    path("projects/<slug:slug>/", web_views.project_detail, name="project-detail"),
    path("projects/<slug:slug>/audit/", views.project_audit, name="project-audit"),
    path("projects/<slug:slug>/webhook/", views.project_webhook, name="project-webhook"),
    path("projects/<slug:slug>/requests/", web_views.project_requests, name="project-requests"),
    path(
        "projects/<slug:slug>/requests/quota/",
        scheduler_views.quota_request_new,
        name="quota-request-new",
    ),
    path("projects/<slug:slug>/limits/", scheduler_views.project_limits, name="project-limits"),
    path("ops/requests/", web_views.request_queue, name="request-queue"),
    path(
        "ops/requests/quota/<int:request_id>/decide/",
        scheduler_views.quota_request_decide,
        name="quota-request-decide",
    ),
    path(
        "projects/<slug:slug>/invitations/<int:invitation_id>/revoke/",
        views.invitation_revoke,
        name="invitation-revoke",
    ),
    path("projects/<slug:slug>/members/add/", views.member_add, name="member-add"),
    path(
        "projects/<slug:slug>/members/<int:membership_id>/role/",
        views.member_role,
        name="member-role",
    ),
    path(
        "projects/<slug:slug>/members/<int:membership_id>/remove/",
        views.member_remove,
        name="member-remove",
    ),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
    path("gpus/", scheduler_views.catalog, name="catalog"),
    path("help/", web_views.help_page, name="help"),
    path("jobs/", scheduler_views.job_list, name="job-list"),
    path("jobs/new/", scheduler_views.job_new, name="job-new"),
    path("jobs/dry-run/", scheduler_views.job_dry_run_view, name="job-dry-run"),
    path("jobs/<int:job_id>/", web_views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", scheduler_views.job_cancel_view, name="job-cancel"),
    path(
        "jobs/<int:job_id>/template/", scheduler_views.job_template_save, name="job-template-save"
    ),
    path(
        "jobs/templates/<int:template_id>/delete/",
        scheduler_views.job_template_delete,
        name="job-template-delete",
    ),
    path("jobs/<int:job_id>/resize/", scheduler_views.job_resize_view, name="job-resize"),
    path("jobs/<int:job_id>/logs/", scheduler_views.job_logs, name="job-logs"),
    path("jobs/<int:job_id>/array/", scheduler_views.job_array, name="job-array"),
    path(
        "jobs/<int:job_id>/array/retry/",
        scheduler_views.job_array_retry,
        name="job-array-retry",
    ),
    path(
        "jobs/<int:job_id>/logs/download/",
        scheduler_views.job_logs_download,
        name="job-logs-download",
    ),
    path(
        "jobs/<int:job_id>/manifest/",
        scheduler_views.job_manifest_download,
        name="job-manifest-download",
    ),
    path("billing/", include("billing.urls")),
    path("", include("storage.urls")),
    path("monitoring/", include("monitoring.urls")),
    path("ops/nodes/", ops_views.node_list, name="ops-nodes"),
    path("ops/nodes/<int:node_id>/", web_views.node_detail, name="ops-node-detail"),
    path("ops/nodes/<int:node_id>/<slug:action>/", ops_views.node_action, name="ops-node-action"),
    path("ops/pools/", ops_views.pool_list, name="ops-pools"),
    path(
        "ops/nodes/<int:node_id>/slurm/<slug:action>/",
        slurm_views.slurm_node_action,
        name="ops-slurm-node-action",
    ),
    path("metrics", ratelimited("metrics", settings.METRICS_RATE)(metrics_view), name="metrics"),
    # The admin's login: the same lockout (its form and the backend) and the same rate limit.
    path(
        "admin/login/",
        ratelimited("login", _login_rate, methods=("POST",), page=True)(admin.site.login),
    ),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="api-schema", template_name="portal/api_docs.html"),
        name="api-docs",
    ),
]
if settings.OIDC_ENABLED:  # optional single sign-on through OpenID Connect (portal/oidc.py)
    urlpatterns.append(path("oidc/", include("mozilla_django_oidc.urls")))
