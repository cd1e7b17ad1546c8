"""What the agent API answers, for the OpenAPI schema: one serializer per `agent.protocol`
answer (the parity test holds them to each other). The views build plain dicts; these only
describe them."""

from __future__ import annotations

from rest_framework import serializers

from agent.protocol import ACTIONS, STOP_REASONS, VOLUME_KINDS


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
    deleted_volumes = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text="Node-local volumes deleted in the portal: the agent removes their files.",
    )


class VolumeMount(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.IntegerField(help_text="0 for a scratch volume (one per job and name).")
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=list(VOLUME_KINDS))
    mount_path = serializers.CharField(help_text="Absolute path in the container.")
    # the wire's name; DRF takes declared fields off the class, so Field.read_only stays a bool
    read_only = serializers.BooleanField()  # type: ignore[assignment]
    limit_mib = serializers.IntegerField(help_text="Size limit; 0: none.")


class CheckpointPlace(serializers.Serializer):  # type: ignore[type-arg]
    volume = serializers.CharField(help_text="The name of one of the assignment's volumes.")
    path = serializers.CharField(allow_blank=True, help_text="Relative, inside that volume.")


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
    working_dir = serializers.CharField(
        allow_null=True, help_text="In the container; null: /workspace. Never a host path."
    )
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
    project_id = serializers.IntegerField(required=False)
    volumes = VolumeMount(many=True, required=False)
    checkpoint = CheckpointPlace(required=False, allow_null=True)


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
