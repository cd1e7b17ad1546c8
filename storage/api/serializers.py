"""Storage API bodies: volumes, a dataset's upload, the storage quota and its requests."""

from __future__ import annotations

from rest_framework import serializers

from storage.models import MAX_VOLUME_GIB, StorageQuotaRequest, Volume, VolumeKind


class VolumeSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    mounted_read_only = serializers.BooleanField(
        source="read_only", read_only=True, help_text="Datasets are always mounted read-only."
    )
    progress_percent = serializers.IntegerField(read_only=True)
    state = serializers.CharField(read_only=True, help_text="active, deleting or deleted")
    fill_state = serializers.CharField(
        read_only=True, help_text="Datasets: empty, uploading, importing, ready or failed."
    )

    class Meta:
        model = Volume
        fields = [
            "id",
            "name",
            "kind",
            "size_gib",
            "is_dataset",
            "mounted_read_only",
            "node_name",
            "source_url",
            "file_name",
            "size_bytes",
            "upload_offset",
            "progress_percent",
            "fill_state",
            "fill_error",
            "sha256",
            "used_bytes",
            "state",
            "created_at",
        ]
        read_only_fields = fields


class VolumeCreateSerializer(serializers.Serializer):  # type: ignore[type-arg]
    name = serializers.RegexField(
        r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$",
        max_length=63,
        help_text="Lowercase letters, digits, hyphens; unique in the project.",
    )
    kind = serializers.ChoiceField(choices=VolumeKind.choices, default=VolumeKind.SHARED)
    size_gib = serializers.IntegerField(min_value=1, max_value=MAX_VOLUME_GIB)
    is_dataset = serializers.BooleanField(
        default=False, help_text="A read-only shared volume filled by an upload or an import."
    )
    node_name = serializers.CharField(
        max_length=253,
        required=False,
        default="",
        allow_blank=True,
        help_text="Node-local volumes: the node to keep it on (else the first job's node).",
    )
    source_url = serializers.CharField(
        max_length=2000,
        required=False,
        default="",
        allow_blank=True,
        help_text="Datasets: import from this http(s) URL.",
    )


class UploadStartSerializer(serializers.Serializer):  # type: ignore[type-arg]
    file_name = serializers.CharField(max_length=1000)
    size_bytes = serializers.IntegerField(min_value=1)


class UploadStatusSerializer(serializers.Serializer):  # type: ignore[type-arg]
    state = serializers.CharField()
    offset = serializers.IntegerField(help_text="Bytes received: send the next chunk from here.")
    size_bytes = serializers.IntegerField()
    percent = serializers.IntegerField()
    sha256 = serializers.CharField()
    file_name = serializers.CharField()
    error = serializers.CharField()


class StorageQuotaSerializer(serializers.Serializer):  # type: ignore[type-arg]
    quota_gib = serializers.IntegerField()
    allocated_gib = serializers.IntegerField(help_text="The live volumes' size limits, summed.")
    free_gib = serializers.IntegerField()
    used_bytes = serializers.IntegerField(help_text="Last measured use of the volumes.")
    volumes = serializers.IntegerField()


class StorageQuotaSetSerializer(serializers.Serializer):  # type: ignore[type-arg]
    max_gib = serializers.IntegerField(min_value=0)


class StorageRequestSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    status = serializers.CharField(read_only=True, help_text="pending, approved or declined")

    class Meta:
        model = StorageQuotaRequest
        fields = [
            "id",
            "max_gib",
            "justification",
            "status",
            "created_at",
            "decided_at",
            "decision_reason",
        ]
        read_only_fields = ["id", "status", "created_at", "decided_at", "decision_reason"]


class DecisionSerializer(serializers.Serializer):  # type: ignore[type-arg]
    decision = serializers.ChoiceField(choices=["approve", "decline"])
    reason = serializers.CharField(
        max_length=2000,
        required=False,
        default="",
        allow_blank=True,
        help_text="Why; required to decline.",
    )
