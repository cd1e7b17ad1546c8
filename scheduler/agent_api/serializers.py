"""What agents send to /api/agent/v1/, as DRF serializers: the contract and its explanations.

The two requests agents send most (idle syncs, heartbeats) are usually parsed without these,
by `scheduler.agent_api.fastparse`, which answers exactly what these would.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from agent.protocol import EXIT_REASONS as PROTOCOL_EXIT_REASONS
from agent.protocol import MAX_HEARTBEAT_RUNNING, MAX_HEARTBEAT_SAMPLES, MAX_SAMPLE_PROCESSES
from portal.api.serializers import StrictSerializer

# Every count the agent sends fits the database's bigint: a larger one (a job id beyond 64
# bits) is a 400 naming the field, never a 500 from the database. `fastparse` uses the same.
# Attempts and log sequence numbers are stored as integers (PositiveIntegerField).
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def count_field(
    *, min_value: int = 0, max_value: int = INT64_MAX, **kwargs: Any
) -> serializers.IntegerField:
    """An integer from `min_value` up to the largest bigint (or `max_value`)."""
    return serializers.IntegerField(min_value=min_value, max_value=max_value, **kwargs)


class GpuInventorySerializer(StrictSerializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    uuid = serializers.RegexField(r"^[A-Za-z0-9-]{4,64}$")
    name = serializers.CharField(max_length=100)
    memory_mib = serializers.IntegerField(min_value=1, max_value=4 * 1024 * 1024)
    mig_mode = serializers.BooleanField(default=False)


class RegisterSerializer(StrictSerializer):
    hostname = serializers.CharField(max_length=253)
    address = serializers.CharField(max_length=255, allow_blank=True, default="")
    simulated = serializers.BooleanField(default=False)
    driver_version = serializers.CharField(max_length=32, allow_blank=True, default="")
    cuda_version = serializers.CharField(max_length=16, allow_blank=True, default="")
    cpu_milli = serializers.IntegerField(min_value=0, max_value=10_000_000, default=0)
    memory_mib = serializers.IntegerField(min_value=0, max_value=1 << 32, default=0)
    gpus = GpuInventorySerializer(many=True, allow_empty=True)
    gang_members = serializers.BooleanField(default=True)
    gang_members_reason = serializers.CharField(max_length=300, allow_blank=True, default="")

    def validate_gpus(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(value) > 64:
            raise serializers.ValidationError("At most 64 GPUs per node.")
        return value


class ProcessSerializer(StrictSerializer):
    pid = count_field(min_value=0)
    used_memory_mib = count_field(min_value=0, allow_null=True, required=False)


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
    memory_used_mib = count_field(min_value=0, allow_null=True, required=False)
    temperature_c = NumberField(min_value=-50, max_value=200, allow_null=True, required=False)
    power_w = NumberField(min_value=0, max_value=5000, allow_null=True, required=False)
    ecc_uncorrected = count_field(min_value=0, allow_null=True, required=False)
    row_remap_pending = serializers.BooleanField(allow_null=True, required=False)
    xid_events = serializers.ListField(
        child=count_field(min_value=0), max_length=100, required=False
    )
    throttle_reasons = serializers.ListField(
        child=serializers.CharField(max_length=64, allow_blank=True), max_length=32, required=False
    )
    processes = ProcessSerializer(many=True, required=False, max_length=MAX_SAMPLE_PROCESSES)  # type: ignore[call-arg]
    lost = serializers.BooleanField(default=False)
    # seconds before this heartbeat the sample was taken (agents batch 1 Hz samples)
    age_s = NumberField(min_value=0, max_value=600, required=False)


class RunningSerializer(StrictSerializer):
    job_id = count_field(min_value=1)
    attempt = count_field(min_value=0, max_value=INT32_MAX)
    pid = count_field(min_value=0, allow_null=True, required=False)


class HeartbeatSerializer(StrictSerializer):
    # bounded by the protocol: a heartbeat's cost to the portal has a ceiling
    telemetry = TelemetrySerializer(many=True, max_length=MAX_HEARTBEAT_SAMPLES)  # type: ignore[call-arg]
    running = RunningSerializer(many=True, max_length=MAX_HEARTBEAT_RUNNING)  # type: ignore[call-arg]


EXIT_REASONS = list(PROTOCOL_EXIT_REASONS)
DIGEST = r"^[A-Za-z0-9_+.-]{1,32}:[0-9a-fA-F]{32,128}$"


class StartedSerializer(StrictSerializer):
    attempt = count_field(min_value=1, max_value=INT32_MAX)
    pid = count_field(min_value=0, allow_null=True, required=False)
    image_digest = serializers.RegexField(DIGEST, required=False)
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")


class ExitedSerializer(StrictSerializer):
    attempt = count_field(min_value=1, max_value=INT32_MAX)
    exit_code = serializers.IntegerField(min_value=-255, max_value=255, allow_null=True)
    signal = serializers.IntegerField(min_value=0, max_value=128, allow_null=True, required=False)
    reason = serializers.ChoiceField(choices=EXIT_REASONS)
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")


class LogSerializer(StrictSerializer):
    attempt = count_field(min_value=1, max_value=INT32_MAX)
    seq = count_field(min_value=0, max_value=INT32_MAX)
    stream = serializers.ChoiceField(choices=["stdout", "stderr"])
    text = serializers.CharField(max_length=256 * 1024, allow_blank=True, trim_whitespace=False)


class SyncStartedReport(StrictSerializer):
    """What the schema says of a started report (parsing is `SyncReportSerializer`)."""

    kind = serializers.ChoiceField(choices=["started"])
    job_id = count_field(min_value=1)
    attempt = count_field(min_value=1, max_value=INT32_MAX)
    pid = count_field(min_value=0, allow_null=True, required=False)
    image_digest = serializers.RegexField(DIGEST, required=False)
    message = serializers.CharField(max_length=2000, allow_blank=True, default="")


class SyncExitedReport(StrictSerializer):
    """What the schema says of an exited report: exit_code and reason are required."""

    kind = serializers.ChoiceField(choices=["exited"])
    job_id = count_field(min_value=1)
    attempt = count_field(min_value=1, max_value=INT32_MAX)
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
    job_id = count_field(min_value=1)
    attempt = count_field(min_value=1, max_value=INT32_MAX)
    pid = count_field(min_value=0, allow_null=True, required=False)
    image_digest = serializers.RegexField(DIGEST, required=False)
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
