"""Agent endpoints under /api/agent/v1/. Thin: parse, call a node service, answer."""

from __future__ import annotations

import re
from typing import Any, TypeGuard

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_field
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

from portal.api.schema import PortalAutoSchema, StrictJSONParser
from portal.api.serializers import StrictSerializer
from portal.ratelimit import FixedWindowMixin
from scheduler import dispatch, nodes
from scheduler.agent_api import gate
from scheduler.models import Node


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

    def fresh_node(self) -> Node:
        """The node as the database has it now, its token checked there."""
        node = nodes.node_for_agent_token_hash(self._token_hash, self.node_id)
        if node is None:
            nodes.agent_token_forget(self._token_hash)
            raise exceptions.AuthenticationFailed("Unknown or retired node token.")
        self._node = node
        return node

    def __str__(self) -> str:
        return f"agent:{self.node_id}"


class NodeTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[AgentPrincipal, None] | None:
        header = authentication.get_authorization_header(request).decode("latin-1").split()
        if len(header) != 2 or header[0] != "Bearer":
            raise exceptions.NotAuthenticated("Send 'Authorization: Bearer <node token>'.")
        found = gate.agent_lookup(header[1], throttle=AgentThrottle().window())
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
    """Per node: a runaway agent cannot flood the portal.

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


class AgentView(APIView):
    schema = PortalAutoSchema()
    parser_classes = [StrictJSONParser]  # agents speak JSON; the schema says only that
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsAgent]
    throttle_classes = [AgentThrottle]

    @property
    def node(self) -> Node:
        node: Node = self.request.user.node  # type: ignore[union-attr]
        return node


class GpuInventorySerializer(StrictSerializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    uuid = serializers.RegexField(r"^[A-Za-z0-9-]{4,64}$")
    name = serializers.CharField(max_length=100)
    memory_mib = serializers.IntegerField(min_value=1, max_value=4 * 1024 * 1024)
    mig_mode = serializers.BooleanField(default=False)


class RegisterSerializer(StrictSerializer):
    hostname = serializers.CharField(max_length=253)
    simulated = serializers.BooleanField(default=False)
    driver_version = serializers.CharField(max_length=32, allow_blank=True, default="")
    cuda_version = serializers.CharField(max_length=16, allow_blank=True, default="")
    cpu_milli = serializers.IntegerField(min_value=0, max_value=10_000_000, default=0)
    memory_mib = serializers.IntegerField(min_value=0, max_value=1 << 32, default=0)
    gpus = GpuInventorySerializer(many=True, allow_empty=True)

    def validate_gpus(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(value) > 64:
            raise serializers.ValidationError("At most 64 GPUs per node.")
        return value


class ProcessSerializer(StrictSerializer):
    pid = serializers.IntegerField(min_value=0)
    used_memory_mib = serializers.IntegerField(min_value=0, allow_null=True, required=False)


class NumberField(serializers.FloatField):
    """A JSON number: DRF's FloatField would take `true` as 1.0."""

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool):
            self.fail("invalid")
        value: float = super().to_internal_value(data)
        return value


class TelemetrySerializer(StrictSerializer):
    uuid = serializers.CharField(max_length=64, trim_whitespace=False)  # as NVML reports it
    utilization = NumberField(min_value=0, max_value=100, allow_null=True, required=False)
    memory_used_mib = serializers.IntegerField(min_value=0, allow_null=True, required=False)
    temperature_c = NumberField(min_value=-50, max_value=200, allow_null=True, required=False)
    power_w = NumberField(min_value=0, max_value=5000, allow_null=True, required=False)
    ecc_uncorrected = serializers.IntegerField(min_value=0, allow_null=True, required=False)
    row_remap_pending = serializers.BooleanField(allow_null=True, required=False)
    xid_events = serializers.ListField(
        child=serializers.IntegerField(min_value=0), max_length=100, required=False
    )
    throttle_reasons = serializers.ListField(
        child=serializers.CharField(max_length=64, allow_blank=True), max_length=32, required=False
    )
    processes = ProcessSerializer(many=True, required=False)
    lost = serializers.BooleanField(default=False)
    # seconds before this heartbeat the sample was taken (agents batch 1 Hz samples)
    age_s = NumberField(min_value=0, max_value=600, required=False)


class RunningSerializer(StrictSerializer):
    job_id = serializers.IntegerField(min_value=1)
    attempt = serializers.IntegerField(min_value=0)
    pid = serializers.IntegerField(min_value=0, allow_null=True, required=False)


class HeartbeatSerializer(StrictSerializer):
    # up to 64 GPUs × 32 sampled instants
    telemetry = TelemetrySerializer(many=True, max_length=2048)  # type: ignore[call-arg]
    running = RunningSerializer(many=True, max_length=1000)  # type: ignore[call-arg]


EXIT_REASONS = ["exited", "killed", "preempted", "cancelled", "failed_to_start"]


class StartedSerializer(StrictSerializer):
    attempt = serializers.IntegerField(min_value=1)
    pid = serializers.IntegerField(min_value=0, allow_null=True, required=False)


class ExitedSerializer(StrictSerializer):
    attempt = serializers.IntegerField(min_value=1)
    exit_code = serializers.IntegerField(min_value=-255, max_value=255, allow_null=True)
    signal = serializers.IntegerField(min_value=0, max_value=128, allow_null=True, required=False)
    reason = serializers.ChoiceField(choices=EXIT_REASONS)
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")


class LogSerializer(StrictSerializer):
    attempt = serializers.IntegerField(min_value=1)
    seq = serializers.IntegerField(min_value=0)
    stream = serializers.ChoiceField(choices=["stdout", "stderr"])
    text = serializers.CharField(max_length=256 * 1024, allow_blank=True, trim_whitespace=False)


class SyncStartedReport(StrictSerializer):
    """What the schema says of a started report (parsing is `SyncReportSerializer`)."""

    kind = serializers.ChoiceField(choices=["started"])
    job_id = serializers.IntegerField(min_value=1)
    attempt = serializers.IntegerField(min_value=1)
    pid = serializers.IntegerField(min_value=0, allow_null=True, required=False)
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")


class SyncExitedReport(StrictSerializer):
    """What the schema says of an exited report: exit_code and reason are required."""

    kind = serializers.ChoiceField(choices=["exited"])
    job_id = serializers.IntegerField(min_value=1)
    attempt = serializers.IntegerField(min_value=1)
    exit_code = serializers.IntegerField(min_value=-255, max_value=255, allow_null=True)
    signal = serializers.IntegerField(min_value=0, max_value=128, allow_null=True, required=False)
    reason = serializers.ChoiceField(choices=EXIT_REASONS)
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")


@extend_schema_field(
    PolymorphicProxySerializer(
        component_name="SyncReport",
        serializers={"started": SyncStartedReport, "exited": SyncExitedReport},
        resource_type_field_name="kind",
        many=True,
    )
)
class SyncReportList(serializers.ListSerializer):  # type: ignore[type-arg]
    """The reports of a sync; the schema shows each as a started or an exited report."""


class SyncReportSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=["started", "exited"])
    job_id = serializers.IntegerField(min_value=1)
    attempt = serializers.IntegerField(min_value=1)
    pid = serializers.IntegerField(min_value=0, allow_null=True, required=False)
    exit_code = serializers.IntegerField(
        min_value=-255, max_value=255, allow_null=True, required=False
    )
    signal = serializers.IntegerField(min_value=0, max_value=128, allow_null=True, required=False)
    reason = serializers.ChoiceField(choices=EXIT_REASONS, required=False)
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")

    class Meta:
        list_serializer_class = SyncReportList

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["kind"] == "exited":
            missing = [f for f in ("exit_code", "reason") if f not in attrs]
            if missing:
                raise serializers.ValidationError(
                    {f: ["An exited report needs exit_code and reason."] for f in missing}
                )
        elif any(f in attrs for f in ("exit_code", "signal", "reason")):
            raise serializers.ValidationError(
                {"kind": ["A started report has no exit_code, signal or reason."]}
            )
        return attrs


class SyncSerializer(StrictSerializer):
    version = serializers.RegexField(
        r"^[0-9a-f]{1,64}$", required=False, allow_null=True, allow_blank=True
    )
    reports = SyncReportSerializer(many=True, max_length=500, default=list)  # type: ignore[call-arg]
    assignments = serializers.BooleanField(default=True)  # false: only the reports, no answer


_SYNC_FIELDS = frozenset({"version", "reports", "assignments"})
_SYNC_VERSION = re.compile(r"[0-9a-f]{1,64}")


def _idle_sync(data: Any) -> dict[str, Any] | None:
    """What `SyncSerializer` makes of a sync without reports, found without building one (the
    agents' most frequent request); None for anything else, which the serializer parses."""
    if not isinstance(data, dict) or not data.keys() <= _SYNC_FIELDS:
        return None
    version, assignments = data.get("version"), data.get("assignments", True)
    if data.get("reports", []) != [] or not isinstance(assignments, bool):
        return None
    if version is not None and not (
        isinstance(version, str) and (version == "" or _SYNC_VERSION.fullmatch(version))
    ):
        return None
    parsed: dict[str, Any] = {"reports": [], "assignments": assignments}
    if "version" in data:
        parsed["version"] = version
    return parsed


_INT64_MAX = 2**63 - 1
_NUMBER_RANGES = {"utilization": (0, 100), "temperature_c": (-50, 200), "power_w": (0, 5000)}
_TELEMETRY_FIELDS = frozenset(TelemetrySerializer._declared_fields)
_RUNNING_FIELDS = frozenset(RunningSerializer._declared_fields)
_PROCESS_FIELDS = frozenset(ProcessSerializer._declared_fields)


def _count(value: Any) -> TypeGuard[int]:
    return type(value) is int and 0 <= value <= _INT64_MAX


def _plain_text(value: Any, max_length: int, *, blank: bool) -> bool:
    """A string DRF's CharField keeps as it is (ASCII, nothing to trim, no NUL)."""
    return (
        type(value) is str
        and (blank or value != "")
        and len(value) <= max_length
        and value.isascii()
        and "\x00" not in value
    )


def _plain_telemetry(record: Any) -> dict[str, Any] | None:
    """What `TelemetrySerializer` makes of one sample, or None where it might differ."""
    if type(record) is not dict or not record.keys() <= _TELEMETRY_FIELDS:
        return None
    uuid = record.get("uuid")
    if not _plain_text(uuid, 64, blank=False):
        return None
    out: dict[str, Any] = {"uuid": uuid}
    for name, (low, high) in _NUMBER_RANGES.items():
        if name in record:
            value = record[name]
            if value is not None and not (type(value) in (int, float) and low <= value <= high):
                return None
            out[name] = None if value is None else float(value)
    for name in ("memory_used_mib", "ecc_uncorrected"):
        if name in record:
            if record[name] is not None and not _count(record[name]):
                return None
            out[name] = record[name]
    if "row_remap_pending" in record:
        pending = record["row_remap_pending"]
        if pending is not None and type(pending) is not bool:  # 0 == False, yet DRF says False
            return None
        out["row_remap_pending"] = pending
    if "xid_events" in record:
        xids = record["xid_events"]
        if type(xids) is not list or len(xids) > 100 or not all(_count(x) for x in xids):
            return None
        out["xid_events"] = list(xids)
    if "throttle_reasons" in record:
        reasons = record["throttle_reasons"]
        if type(reasons) is not list or len(reasons) > 32:
            return None
        if not all(_plain_text(r, 64, blank=True) and r == r.strip() for r in reasons):
            return None
        out["throttle_reasons"] = list(reasons)
    if "processes" in record:
        processes = []
        for process in record["processes"] if type(record["processes"]) is list else [None]:
            if type(process) is not dict or not process.keys() <= _PROCESS_FIELDS:
                return None
            if not _count(process.get("pid")):
                return None
            used = process.get("used_memory_mib", 0)
            if used is not None and not _count(used):
                return None
            processes.append(dict(process))
        out["processes"] = processes
    lost = record.get("lost", False)
    if type(lost) is not bool:
        return None
    out["lost"] = lost
    if "age_s" in record:
        age = record["age_s"]
        if not (type(age) in (int, float) and 0 <= age <= 600):
            return None
        out["age_s"] = float(age)
    return out


def _plain_heartbeat(data: Any) -> dict[str, Any] | None:
    """What `HeartbeatSerializer` makes of a heartbeat as agents send it, found without
    building a serializer per sample (a node sends 40 of them every few seconds); None for
    anything else, which the serializer parses and, if need be, explains."""
    if type(data) is not dict or data.keys() != {"telemetry", "running"}:
        return None
    telemetry, running = data["telemetry"], data["running"]
    if type(telemetry) is not list or len(telemetry) > 2048:
        return None
    if type(running) is not list or len(running) > 1000:
        return None
    samples = []
    for record in telemetry:
        sample = _plain_telemetry(record)
        if sample is None:
            return None
        samples.append(sample)
    attempts = []
    for entry in running:
        if type(entry) is not dict or not entry.keys() <= _RUNNING_FIELDS:
            return None
        job_id, attempt, pid = entry.get("job_id"), entry.get("attempt"), entry.get("pid", 0)
        if not (_count(job_id) and job_id >= 1 and _count(attempt)):
            return None
        if pid is not None and not _count(pid):
            return None
        attempts.append(dict(entry))
    return {"telemetry": samples, "running": attempts}


def _parse(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:  # type: ignore[type-arg]
    body = serializer_class(data=request.data)
    body.is_valid(raise_exception=True)
    data: dict[str, Any] = body.validated_data
    return data


class RegisterView(AgentView):
    @extend_schema(request=RegisterSerializer, responses={200: dict})
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
    @extend_schema(request=HeartbeatSerializer, responses={200: dict})
    def post(self, request: Request) -> Response:
        data = _plain_heartbeat(request.data) or _parse(HeartbeatSerializer, request)
        node = nodes.node_heartbeat(
            node=self.node, telemetry=data["telemetry"], running=data["running"]
        )
        return Response({"ok": True, "fenced": node.fenced})


class AssignmentsView(AgentView):
    """The assignments in full (agents before /sync)."""

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        node = self.node
        return Response({"fenced": node.fenced, "assignments": nodes.assignments_for(node)})


class SyncView(AgentView):
    """One round trip: apply the agent's started/exited reports, answer its assignments.

    With the `version` of the assignments it last received, an unchanged answer is
    `{"unchanged": true}` and costs no SQL when there is nothing to report.
    """

    @extend_schema(request=SyncSerializer, responses={200: dict})
    def post(self, request: Request) -> Response:
        data = _idle_sync(request.data) or _parse(SyncSerializer, request)
        agent: AgentPrincipal = request.user  # type: ignore[assignment]
        results = (
            nodes.agent_reports_apply(node=self.node, reports=data["reports"])
            if data["reports"]
            else []
        )
        if not data["assignments"]:
            return Response({"results": results})
        version = data.get("version")
        # The version read with the token holds unless reports were applied since: they may
        # have changed the assignments, so it is read again after them.
        current = (
            dispatch.assignments_version(agent.node_id)
            if results
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
    @extend_schema(request=StartedSerializer, responses={200: dict})
    def post(self, request: Request, job_id: int) -> Response:
        data = _parse(StartedSerializer, request)
        job = nodes.job_started(
            node=self.node, job_id=job_id, attempt=data["attempt"], pid=data.get("pid")
        )
        return Response({"state": job.state})


class JobExitedView(AgentView):
    @extend_schema(request=ExitedSerializer, responses={200: dict})
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
    @extend_schema(request=LogSerializer, responses={201: dict, 200: dict})
    def post(self, request: Request, job_id: int) -> Response:
        data = _parse(LogSerializer, request)
        new = nodes.job_log_append(node=self.node, job_id=job_id, **data)
        return Response(
            {"stored": new}, status=status.HTTP_201_CREATED if new else status.HTTP_200_OK
        )
