"""Agent endpoints under /api/agent/v1/. Thin: parse, call a node service, answer."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema
from rest_framework import (
    authentication,
    exceptions,
    permissions,
    serializers,
    status,
)
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from foundation.ratelimit import FixedWindowMixin
from portal.api.schema import PortalAutoSchema, StrictJSONParser
from scheduler import dispatch, nodes
from scheduler.agent_api import answers, fastparse, gate
from scheduler.agent_api.serializers import (
    INT64_MAX,
    ExitedSerializer,
    HeartbeatSerializer,
    LogSerializer,
    RegisterSerializer,
    StartedSerializer,
    SyncSerializer,
)
from scheduler.images import images_to_keep_pulled
from scheduler.models import Node
from scheduler.nodes.assignments import deleted_volumes_for


class AgentPrincipal:
    """The identity of a node's agent: authenticated, but not a user of the portal.

    Authentication only looks up which node a token names (remembered in the cache, so a poll
    that finds nothing new costs no SQL); `node` loads the node and checks the token again in
    the database, so whatever reads or writes the node's data is checked there. The same
    round trip to the cache counted the request against the node's throttle and read its
    assignment version (`gate.agent_lookup`); `AgentThrottle` and `SyncView` use those.
    """

    is_authenticated = True
    is_staff = False
    is_active = True

    def __init__(self, found: gate.AgentLookup) -> None:
        self.node_id = found.node_id
        self._token_hash = found.token_hash
        self.lookup = found
        self._node: Node | None = None

    @property
    def node(self) -> Node:
        return self._node if self._node is not None else self.fresh_node()

    @property
    def token_hash(self) -> str:
        return self._token_hash

    def fresh_node(self) -> Node:
        """The node as the database has it now, its token checked there."""
        node = nodes.node_for_agent_token_hash(self._token_hash, self.node_id)
        if node is None:
            raise self.refused()
        self._node = node
        return node

    def refused(self) -> exceptions.AuthenticationFailed:
        """The database no longer knows the token (issued anew, node retired): neither does
        the cache from now on."""
        nodes.agent_token_forget(self._token_hash)
        return exceptions.AuthenticationFailed("Unknown or retired node token.")

    def __str__(self) -> str:
        return f"agent:{self.node_id}"


class NodeTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[AgentPrincipal, None] | None:
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if len(header) != 2 or header[0] != "Bearer":
            raise exceptions.NotAuthenticated("Send 'Authorization: Bearer <node token>'.")
        view = (request.parser_context or {}).get("view")
        throttle = next(
            (t for t in getattr(view, "throttle_classes", ()) if issubclass(t, AgentThrottle)),
            AgentThrottle,
        )
        found = gate.agent_lookup(header[1], throttle=throttle().window())
        if found is None:
            raise exceptions.AuthenticationFailed("Unknown or retired node token.")
        return AgentPrincipal(found), None

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class NodeTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "scheduler.agent_api.views.NodeTokenAuthentication"
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A node's agent token."}


class IsAgent(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, AgentPrincipal)


class AgentThrottle(FixedWindowMixin):
    """Per node and kind of request: a runaway agent (or a stolen token) cannot flood the portal.

    Syncs and the other reports count in `agent`, heartbeats in `agent_heartbeat`, log chunks
    in `agent_logs`: each rate is what an agent needs with a margin (the settings say how
    much), and a burst of log chunks cannot starve the heartbeats that keep a node alive.
    The hit is counted during authentication, in the round trip that looks up the token
    (`gate.agent_lookup`, with `window()`); here it is only compared with the limit.
    """

    scope = "agent"

    def window(self) -> gate.AgentThrottleWindow | None:
        """The window authentication counts each node's hits in; None: agents are unlimited."""
        if self.duration is None:
            return None
        key_template = self.cache_format % {"scope": self.scope, "ident": "%(ident)s"}
        return gate.AgentThrottleWindow(key_template, self.duration)

    def allow_request(self, request: Request, view: Any) -> bool:
        user = request.user
        if not isinstance(user, AgentPrincipal) or user.lookup.throttle_hits is None:
            return True
        if self.num_requests is None:
            return True
        self.retry_after = user.lookup.retry_after
        return user.lookup.throttle_hits <= self.num_requests


class AgentHeartbeatThrottle(AgentThrottle):
    scope = "agent_heartbeat"


class AgentLogsThrottle(AgentThrottle):
    scope = "agent_logs"


class AgentView(APIView):
    """Every agent endpoint: a node token, JSON, the node's throttle; a job id in the path
    beyond the database's bigint names no job (404, not a 500)."""

    schema = PortalAutoSchema()
    parser_classes = [StrictJSONParser]  # agents speak JSON; the schema says only that
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsAgent]
    throttle_classes = [AgentThrottle]

    @property
    def node(self) -> Node:
        node: Node = self.request.user.node  # type: ignore[union-attr]
        return node

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if kwargs.get("job_id", 0) > INT64_MAX:
            raise exceptions.NotFound("No such job.")


def _parse(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:  # type: ignore[type-arg]
    body = serializer_class(data=request.data)
    body.is_valid(raise_exception=True)
    data: dict[str, Any] = body.validated_data
    return data


class RegisterView(AgentView):
    @extend_schema(request=RegisterSerializer, responses={200: answers.RegisterAnswer})
    def post(self, request: Request) -> Response:
        node = nodes.node_register(node=self.node, inventory=_parse(RegisterSerializer, request))
        from django.conf import settings

        return Response(
            {
                "node": node.name,
                "heartbeat_interval_s": settings.NODE_HEARTBEAT_SECONDS,
                "poll_interval_s": settings.AGENT_POLL_SECONDS,
            }
        )


class HeartbeatView(AgentView):
    throttle_classes = [AgentHeartbeatThrottle]

    @extend_schema(request=HeartbeatSerializer, responses={200: answers.HeartbeatAnswer})
    def post(self, request: Request) -> Response:
        data = fastparse.plain_heartbeat(request.data) or _parse(HeartbeatSerializer, request)
        agent: AgentPrincipal = request.user  # type: ignore[assignment]
        # the token is checked in the database by the statement that records the heartbeat
        node = nodes.node_heartbeat(
            node_id=agent.node_id,
            token_hash=agent.token_hash,
            telemetry=data["telemetry"],
            running=data["running"],
        )
        if node is None:
            raise agent.refused()
        answer = {"ok": True, "fenced": node.fenced, "images": images_to_keep_pulled()}
        if deleted := deleted_volumes_for(node):  # node-local volumes to remove (issue 27)
            answer["deleted_volumes"] = deleted
        return Response(answer)


class AssignmentsView(AgentView):
    """The assignments in full (agents before /sync)."""

    @extend_schema(responses={200: answers.AssignmentsAnswer})
    def get(self, request: Request) -> Response:
        node = self.node
        return Response({"fenced": node.fenced, "assignments": nodes.assignments_for(node)})


class SyncView(AgentView):
    """One round trip: apply the agent's started/exited reports, answer its assignments.

    With the `version` of the assignments it last received, an unchanged answer is
    `{"unchanged": true}` and costs no SQL when there is nothing to report.
    """

    @extend_schema(request=SyncSerializer, responses={200: answers.SyncAnswer})
    def post(self, request: Request) -> Response:
        data = fastparse.idle_sync(request.data) or _parse(SyncSerializer, request)
        agent: AgentPrincipal = request.user  # type: ignore[assignment]
        results = (
            nodes.agent_reports_apply(node=self.node, reports=data["reports"])
            if data["reports"]
            else []
        )
        if not data["assignments"]:
            return Response({"results": results})
        version = data.get("version")
        # The version read with the token holds unless reports applied since may have changed
        # the assignments (an exit may; a start never does): then it is read again after them.
        current = (
            dispatch.assignments_version(agent.node_id)
            if results and nodes.reports_change_assignments(data["reports"])
            else agent.lookup.assignments_version
        )
        if version and current == version:
            return Response({"unchanged": True, "version": version, "results": results})
        version = dispatch.assignments_version_mint(agent.node_id)  # before reading, see dispatch
        node = agent.fresh_node()
        return Response(
            {
                "unchanged": False,
                "version": version,
                "fenced": node.fenced,
                "assignments": nodes.assignments_for(node),
                "results": results,
            }
        )


class JobStartedView(AgentView):
    @extend_schema(request=StartedSerializer, responses={200: answers.StateAnswer})
    def post(self, request: Request, job_id: int) -> Response:
        data = _parse(StartedSerializer, request)
        job = nodes.job_started(
            node=self.node,
            job_id=job_id,
            attempt=data["attempt"],
            pid=data.get("pid"),
            image_digest=data.get("image_digest", ""),
        )
        return Response({"state": job.state})


class JobExitedView(AgentView):
    @extend_schema(request=ExitedSerializer, responses={200: answers.StateAnswer})
    def post(self, request: Request, job_id: int) -> Response:
        data = _parse(ExitedSerializer, request)
        report = nodes.ExitReport(
            attempt=data["attempt"],
            exit_code=data["exit_code"],
            signal=data.get("signal"),
            reason=data["reason"],
            message=data.get("message", ""),
        )
        job = nodes.job_exited(node=self.node, job_id=job_id, report=report)
        return Response({"state": job.state})


class JobLogsView(AgentView):
    throttle_classes = [AgentLogsThrottle]

    @extend_schema(
        request=LogSerializer, responses={201: answers.LogsAnswer, 200: answers.LogsAnswer}
    )
    def post(self, request: Request, job_id: int) -> Response:
        data = _parse(LogSerializer, request)
        new = nodes.job_log_append(node=self.node, job_id=job_id, **data)
        return Response(
            {"stored": new}, status=status.HTTP_201_CREATED if new else status.HTTP_200_OK
        )
