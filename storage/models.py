"""Project volumes and datasets, their quota, and requests for more quota.

A volume is a name, a kind and a size limit; the agent derives every host path from its own
configuration and the volume's id (docs/storage.md). No field here is ever a host path.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

GIB = 2**30
MAX_VOLUME_GIB = 1_000_000  # 1 PiB: a typo guard, not a policy

volume_name_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$",
    "Use 1-63 lowercase letters, digits and hyphens, not starting or ending with a hyphen.",
)


class VolumeKind(models.TextChoices):
    SCRATCH = "scratch", "Scratch (per job, removed when the job ends)"
    NODE_LOCAL = "node_local", "Node-local (on one node; jobs go to that node)"
    SHARED = "shared", "Shared (on every node of the pool)"


class VolumeState(models.TextChoices):
    ACTIVE = "active", "Active"
    DELETING = "deleting", "Deleting"  # its files are being removed
    DELETED = "deleted", "Deleted"


class FillState(models.TextChoices):
    """How far a dataset's content is: empty, uploading or importing, ready (sealed), failed."""

    EMPTY = "empty", "Empty"
    UPLOADING = "uploading", "Uploading"
    IMPORTING = "importing", "Importing"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


LIVE_STATES = (VolumeState.ACTIVE, VolumeState.DELETING)


class Volume(models.Model):
    """A project's named volume. Datasets are read-only shared volumes filled once, by an upload
    or an import; their file lands at <STORAGE_SHARED_ROOT>/v<id>/<file name>."""

    project = models.ForeignKey("portal.Project", on_delete=models.CASCADE, related_name="volumes")
    name = models.CharField(max_length=63, validators=[volume_name_validator])
    kind = models.CharField(max_length=16, choices=VolumeKind.choices)
    size_gib = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_VOLUME_GIB)],
        help_text="Size limit in GiB; counted against the project's storage quota.",
    )
    is_dataset = models.BooleanField(default=False)
    node_name = models.CharField(
        max_length=253,
        blank=True,
        help_text="Node-local volumes: the node that holds it (set when first used if blank).",
    )
    # Datasets: where the content came from and what it is.
    source_url = models.URLField(max_length=2000, blank=True)
    file_name = models.CharField(max_length=200, blank=True, help_text="Sanitised file name.")
    size_bytes = models.BigIntegerField(default=0, help_text="The dataset's size once complete.")
    upload_offset = models.BigIntegerField(default=0, help_text="Bytes received so far.")
    fill_state = models.CharField(max_length=16, choices=FillState.choices, default=FillState.EMPTY)
    fill_error = models.CharField(max_length=500, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    used_bytes = models.BigIntegerField(default=0, help_text="Last measured use.")
    state = models.CharField(max_length=16, choices=VolumeState.choices, default=VolumeState.ACTIVE)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"],
                condition=Q(state="active"),
                name="volume_name_unique_active",
                violation_error_message="The project already has a volume of that name.",
            ),
            models.CheckConstraint(condition=Q(size_gib__gte=1), name="volume_size_positive"),
            models.CheckConstraint(
                condition=Q(is_dataset=False) | Q(kind="shared"),
                name="volume_dataset_is_shared",
                violation_error_message="A dataset is a shared volume.",
            ),
            models.CheckConstraint(
                condition=Q(node_name="") | Q(kind="node_local"),
                name="volume_node_only_node_local",
                violation_error_message="Only a node-local volume names a node.",
            ),
        ]
        indexes = [models.Index(fields=["project", "state"], name="volume_project_state")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}" if self.project_id else self.name

    @property
    def is_live(self) -> bool:
        return self.state != VolumeState.DELETED

    @property
    def limit_bytes(self) -> int:
        return self.size_gib * GIB

    @property
    def read_only(self) -> bool:
        """Datasets are always mounted read-only."""
        return self.is_dataset

    @property
    def progress_percent(self) -> int:
        if not self.size_bytes:
            return 100 if self.fill_state == FillState.READY else 0
        return min(100, int(self.upload_offset * 100 // self.size_bytes))


class StorageQuota(models.Model):
    """A project's storage quota: the most GiB its live volumes' size limits may add up to.
    A project without a row has `STORAGE_DEFAULT_QUOTA_GIB`; operators set it."""

    project = models.OneToOneField(
        "portal.Project", on_delete=models.CASCADE, related_name="storage_quota"
    )
    max_gib = models.PositiveIntegerField(validators=[MaxValueValidator(100_000_000)])
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"Storage quota of {self.project}: {self.max_gib} GiB"


class StorageRequestStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # portal.approvals.PENDING
    APPROVED = "approved", "Approved"
    DECLINED = "declined", "Declined"


class StorageQuotaRequest(models.Model):
    """An owner asks for a larger storage quota; an operator approves (the quota becomes
    `max_gib`) or declines with a reason (portal/approvals.py's flow)."""

    project = models.ForeignKey(
        "portal.Project", on_delete=models.CASCADE, related_name="storage_quota_requests"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    max_gib = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(100_000_000)]
    )
    justification = models.TextField(max_length=2000)
    status = models.CharField(
        max_length=10, choices=StorageRequestStatus.choices, default=StorageRequestStatus.PENDING
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(max_length=2000, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "created_at"], name="storage_request_status")]

    def __str__(self) -> str:
        return f"Storage quota request {self.pk} of {self.project} ({self.status})"

    def changes(self) -> list[str]:
        return [f"storage quota: {self.max_gib} GiB"]
