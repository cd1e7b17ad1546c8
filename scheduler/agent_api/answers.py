"""What the agent API answers, for the OpenAPI schema: one serializer per `agent.protocol`
answer (the parity test holds them to each other). The views build plain dicts; these only
describe them."""

from __future__ import annotations

from rest_framework import serializers

from agent.protocol import ACTIONS, STOP_REASONS


class RegisterAnswer(serializers.Serializer):  # type: ignore[type-arg]
    node = serializers.CharField()
    heartbeat_interval_s = serializers.FloatField()
    poll_interval_s = serializers.FloatField()


class HeartbeatAnswer(serializers.Serializer):  # type: ignore[type-arg]
    ok = serializers.BooleanField()
    fenced = serializers.BooleanField()
    images = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="The curated images the node keeps pulled (it pulls the ones it lacks).",
    )


class Assignment(serializers.Serializer):  # type: ignore[type-arg]
    job_id = serializers.IntegerField()
    attempt = serializers.IntegerField()
    action = serializers.ChoiceField(choices=list(ACTIONS))
    stop_reason = serializers.ChoiceField(choices=list(STOP_REASONS), allow_null=True)
    command = serializers.CharField()
    env = serializers.DictField(child=serializers.CharField())
    gpu_uuids = serializers.ListField(child=serializers.CharField())
    share_milli = serializers.IntegerField()
    gpu_memory_limit_mib = serializers.IntegerField(allow_null=True)
    working_dir = serializers.CharField(allow_null=True)
    checkpoint_dir = serializers.CharField(allow_null=True)
    grace_seconds = serializers.FloatField()
    image = serializers.CharField(allow_blank=True, help_text="Empty: the node's default image.")
    time_limit_s = serializers.IntegerField(
        allow_null=True, help_text="Wall clock; the agent stops the attempt past it."
    )
    cpu_milli = serializers.IntegerField(help_text="0: the node's default per GPU.")
    memory_mib = serializers.IntegerField(help_text="0: the node's default per GPU.")
    shm_mib = serializers.IntegerField(
        help_text="Shared memory (/dev/shm) in MiB; 0: the engine's default."
    )


class AssignmentsAnswer(serializers.Serializer):  # type: ignore[type-arg]
    fenced = serializers.BooleanField()
    assignments = Assignment(many=True)


class SyncResult(serializers.Serializer):  # type: ignore[type-arg]
    kind = serializers.ChoiceField(choices=["started", "exited"])
    job_id = serializers.IntegerField()
    attempt = serializers.IntegerField()
    state = serializers.CharField(required=False)
    conflict = serializers.CharField(required=False)


class SyncAnswer(serializers.Serializer):  # type: ignore[type-arg]
    unchanged = serializers.BooleanField(required=False)
    version = serializers.CharField(required=False)
    fenced = serializers.BooleanField(required=False)
    assignments = Assignment(many=True, required=False)
    results = SyncResult(many=True)


class StateAnswer(serializers.Serializer):  # type: ignore[type-arg]
    state = serializers.CharField()


class LogsAnswer(serializers.Serializer):  # type: ignore[type-arg]
    stored = serializers.BooleanField()
