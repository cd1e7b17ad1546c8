"""Monitoring API under /api/v1/monitoring/: chart series, efficiency, cluster, alerts.

Thin: parse parameters (a bad one is a 400 naming it), call a selector scoped to the user,
answer JSON. Job endpoints: members of the job's project (and operators); node, cluster and
alert endpoints: operators only.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from monitoring import selectors
from monitoring.models import Alert
from portal.api.schema import PortalAutoSchema
from portal.errors import DomainError
from portal.models import User
from portal.selectors import project_get_visible
from scheduler.models import Node
from scheduler.selectors import job_get_visible

RANGE = OpenApiParameter(
    "range", OpenApiTypes.STR, enum=list(selectors.RANGES), description="Default 15m."
)
DAYS = OpenApiParameter("days", OpenApiTypes.INT, description="1 to 90; default 30.")


def _user(request: Request) -> User:
    return request.user  # type: ignore[return-value]


def alert_dict(a: Alert) -> dict[str, Any]:
    return {
        "id": a.pk,
        "rule": a.rule,
        "key": a.key,
        "severity": a.severity,
        "message": a.message,
        "node": a.node.name if a.node else None,
        "gpu_id": a.gpu_id,
        "job_id": a.job_id,
        "project": a.project.slug if a.project else None,
        "opened_at": a.opened_at.isoformat(),
        "last_seen_at": a.last_seen_at.isoformat(),
        "resolved_at": a.resolved_at.isoformat() if a.resolved_at else None,
    }


class JobSeriesView(APIView):
    schema = PortalAutoSchema()

    @extend_schema(parameters=[RANGE], responses=OpenApiTypes.OBJECT, summary="Job GPU series")
    def get(self, request: Request, job_id: int) -> Response:
        rng = selectors.parse_range(request.query_params.get("range"))
        job = job_get_visible(user=_user(request), job_id=job_id)
        return Response(selectors.job_series(job, rng, now=timezone.now()))


class JobEfficiencyView(APIView):
    schema = PortalAutoSchema()

    @extend_schema(responses=OpenApiTypes.OBJECT, summary="Job efficiency and cost")
    def get(self, request: Request, job_id: int) -> Response:
        job = job_get_visible(user=_user(request), job_id=job_id)
        eff, billed = selectors.job_efficiency(job, now=timezone.now())
        return Response(
            {"job": job.pk, **eff.as_dict(), "billed_cost": None if billed is None else str(billed)}
        )


class ProjectEfficiencyView(APIView):
    schema = PortalAutoSchema()

    @extend_schema(parameters=[DAYS], responses=OpenApiTypes.OBJECT, summary="Project efficiency")
    def get(self, request: Request, slug: str) -> Response:
        days = selectors.parse_days(request.query_params.get("days"))
        project = project_get_visible(user=_user(request), slug=slug)
        rows, total = selectors.project_efficiency(project, days=days, now=timezone.now())
        return Response(
            {
                "project": project.slug,
                "days": days,
                "total": total.as_dict(),
                "jobs": [
                    {"id": j.pk, "name": j.name, "state": j.state, **e.as_dict()} for j, e in rows
                ],
            }
        )


class NodeSeriesView(APIView):
    schema = PortalAutoSchema()
    permission_classes = [permissions.IsAdminUser]

    @extend_schema(parameters=[RANGE], responses=OpenApiTypes.OBJECT, summary="Node GPU series")
    def get(self, request: Request, node_id: int) -> Response:
        rng = selectors.parse_range(request.query_params.get("range"))
        node = get_object_or_404(Node, pk=node_id)
        return Response(selectors.node_series(node, rng, now=timezone.now()))


class ClusterView(APIView):
    schema = PortalAutoSchema()
    permission_classes = [permissions.IsAdminUser]

    @extend_schema(parameters=[RANGE], responses=OpenApiTypes.OBJECT, summary="Cluster overview")
    def get(self, request: Request) -> HttpResponse:
        rng = selectors.parse_range(request.query_params.get("range"))
        body = selectors.cluster_overview_json(rng, now=timezone.now())
        return HttpResponse(body, content_type="application/json")


class AlertListView(APIView):
    schema = PortalAutoSchema()
    permission_classes = [permissions.IsAdminUser]

    @extend_schema(
        parameters=[
            OpenApiParameter("state", OpenApiTypes.STR, enum=["open", "all"]),
            OpenApiParameter("rule", OpenApiTypes.STR, enum=list(Alert.Rule.values)),
        ],
        responses=OpenApiTypes.OBJECT,
        summary="Alerts",
    )
    def get(self, request: Request) -> Response:
        state = request.query_params.get("state", "open")
        if state not in ("open", "all"):
            raise DomainError("state must be 'open' or 'all'.", field="state")
        qs = selectors.alert_list(open_only=state == "open", rule=request.query_params.get("rule"))
        return Response({"results": [alert_dict(a) for a in qs[:500]]})


class NotificationListView(APIView):
    schema = PortalAutoSchema()

    @extend_schema(responses=OpenApiTypes.OBJECT, summary="My notifications")
    def get(self, request: Request) -> Response:
        qs = selectors.notification_list_of(user=_user(request))[:100]
        return Response(
            {
                "results": [
                    {
                        "id": n.pk,
                        "title": n.title,
                        "body": n.body,
                        "url": n.url,
                        "created_at": n.created_at.isoformat(),
                        "read": n.read_at is not None,
                    }
                    for n in qs
                ]
            }
        )
