"""Monitoring pages: cluster overview, alerts, notifications, efficiency; and /metrics.

Chart data comes from the JSON API (monitoring/api); these views render the shells, the
efficiency partials and the alert table (htmx partial when polled, whole page otherwise).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers

from monitoring import selectors
from monitoring.metrics import metrics_view
from monitoring.models import Alert
from portal.htmx import wants_partial
from portal.models import User
from portal.selectors import project_get_visible, project_list_visible_to
from scheduler.ops_views import staff_required
from scheduler.selectors import job_get_visible

__all__ = ["metrics_view"]


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


@staff_required
def cluster(request: HttpRequest) -> HttpResponse:
    rng = selectors.parse_range(request.GET.get("range"))
    return render(
        request, "monitoring/cluster.html", {"range": rng.name, "ranges": selectors.RANGES}
    )


@staff_required
@vary_on_headers("HX-Request")
def alert_list(request: HttpRequest) -> HttpResponse:
    state = request.GET.get("state", "open")
    if state not in ("open", "all"):
        return render(
            request,
            "error.html",
            {"status": 400, "message": "state must be 'open' or 'all'."},
            status=400,
        )
    rule = request.GET.get("rule") or None
    alerts = list(selectors.alert_list(open_only=state == "open", rule=rule)[:300])
    context = {"alerts": alerts, "state": state, "rule": rule, "rules": Alert.Rule.choices}
    if wants_partial(request):
        return render(request, "monitoring/partials/_alert_table.html", context)
    return render(request, "monitoring/alerts.html", context)


@login_required
def notification_list(request: HttpRequest) -> HttpResponse:
    notes = list(selectors.notification_list_of(user=_user(request))[:100])
    return render(request, "monitoring/notifications.html", {"notes": notes})


@login_required
@require_POST
def notifications_read(request: HttpRequest) -> HttpResponse:
    selectors.notification_list_of(user=_user(request)).filter(read_at__isnull=True).update(
        read_at=timezone.now()
    )
    return redirect("monitoring:notifications")


@login_required
def efficiency(request: HttpRequest) -> HttpResponse:
    projects = project_list_visible_to(user=_user(request))
    return render(request, "monitoring/efficiency.html", {"projects": projects})


@login_required
def project_efficiency(request: HttpRequest, slug: str) -> HttpResponse:
    days = selectors.parse_days(request.GET.get("days"))
    project = project_get_visible(user=_user(request), slug=slug)
    rows, total = selectors.project_efficiency(project, days=days, now=timezone.now())
    return render(
        request,
        "monitoring/project_efficiency.html",
        {"project": project, "days": days, "rows": rows, "total": total},
    )


@login_required
def job_efficiency(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_get_visible(user=_user(request), job_id=job_id)
    eff, billed = selectors.job_efficiency(job, now=timezone.now())
    return render(
        request,
        "monitoring/partials/_job_efficiency.html",
        {"job": job, "eff": eff, "billed": billed},
    )
