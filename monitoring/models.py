"""Monitoring records: telemetry rollups, fleet snapshots, alerts and in-app notifications.

Live values (the latest sample and a short window per GPU) live in Redis, not here; see
`monitoring.live`. These tables hold what must outlast that window.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Resolution(models.TextChoices):
    MINUTE = "1m", "1 minute"
    HOUR = "1h", "1 hour"


class GpuRollup(models.Model):
    """One GPU over one bucket, split by the job that held it (0: nobody held it).

    A GPU shared by two jobs has one row per job carrying the same device numbers: each job
    sees the whole device it shared. Averages are over `samples`.
    """

    resolution = models.CharField(max_length=2, choices=Resolution.choices)
    bucket = models.DateTimeField(help_text="Start of the minute or hour.")
    gpu = models.ForeignKey(
        "scheduler.Gpu", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    held_by_job = models.BigIntegerField(
        default=0, help_text="Id of the job holding the GPU in this bucket; 0 when idle."
    )
    share_milli = models.PositiveIntegerField(default=0)
    samples = models.PositiveIntegerField()
    idle_samples = models.PositiveIntegerField(help_text="Samples under the idle threshold.")
    util_avg = models.FloatField()
    util_max = models.FloatField()
    mem_avg = models.FloatField(help_text="MiB")
    mem_max = models.FloatField()
    temp_avg = models.FloatField(help_text="°C")
    temp_max = models.FloatField()
    power_avg = models.FloatField(help_text="W")
    power_max = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["resolution", "gpu", "held_by_job", "bucket"],
                name="gpurollup_unique_bucket",
                violation_error_message="This GPU already has a rollup for that job and bucket.",
            )
        ]
        indexes = [
            models.Index(fields=["resolution", "bucket"], name="gpurollup_res_bucket_idx"),
            models.Index(
                fields=["held_by_job", "resolution", "bucket"],
                condition=models.Q(held_by_job__gt=0),
                name="gpurollup_job_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} job {self.held_by_job} {self.resolution} {self.bucket:%F %R}"


class ClusterRollup(models.Model):
    """Fleet-wide telemetry of one GPU model over one bucket (for 24 h and 7 d charts)."""

    resolution = models.CharField(max_length=2, choices=Resolution.choices)
    bucket = models.DateTimeField()
    model_name = models.CharField(max_length=40)
    samples = models.PositiveIntegerField()
    held_samples = models.PositiveIntegerField(help_text="Samples of GPUs a job held.")
    util_avg = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["resolution", "model_name", "bucket"],
                name="clusterrollup_unique_bucket",
                violation_error_message="This model already has a rollup for that bucket.",
            )
        ]
        indexes = [
            models.Index(fields=["resolution", "bucket"], name="clusterrollup_res_bucket_idx")
        ]

    def __str__(self) -> str:
        return f"{self.model_name} {self.resolution} {self.bucket:%F %R}"


class RollupFlush(models.Model):
    """One processed batch of raw samples; its token makes a retried flush a no-op."""

    token = models.CharField(max_length=80, unique=True)
    bucket = models.DateTimeField()
    samples = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.token


class FleetSnapshot(models.Model):
    """Capacity and fragmentation once a minute, per GPU model ('' is the whole fleet)."""

    at = models.DateTimeField()
    model_name = models.CharField(max_length=40, blank=True)
    total_gpus = models.PositiveIntegerField()
    free_gpus = models.PositiveIntegerField(help_text="Whole GPUs free on schedulable nodes.")
    allocated_milli = models.PositiveBigIntegerField()
    capacity_milli = models.PositiveBigIntegerField()
    largest_gang = models.PositiveIntegerField(help_text="GPUs of the largest gang that fits.")
    largest_node_block = models.PositiveIntegerField(help_text="Most free GPUs on one node.")
    queued_jobs = models.PositiveIntegerField(default=0)
    frag_ratio = models.FloatField(help_text="Percent of idle GPU capacity that is fragmented.")

    class Meta:
        ordering = ["at", "model_name"]
        constraints = [
            models.UniqueConstraint(
                fields=["at", "model_name"],
                name="fleetsnapshot_unique_at",
                violation_error_message="A snapshot of this model at that minute exists.",
            )
        ]
        indexes = [models.Index(fields=["model_name", "at"], name="fleetsnapshot_model_at_idx")]

    def __str__(self) -> str:
        return f"{self.model_name or 'fleet'} {self.at:%F %R}"


class Alert(models.Model):
    """A rule firing for one subject. One open alert per key; resolved when the condition clears."""

    class Rule(models.TextChoices):
        GPU_TEMPERATURE = "gpu_temperature", "GPU temperature"
        XID = "xid", "XID error"
        ECC = "ecc", "ECC / row remap"
        NODE_LOST = "node_lost", "Node lost"
        QUEUE_WAIT = "queue_wait", "Queue wait too long"
        IDLE_ALLOCATION = "idle_allocation", "Idle allocation"

    class Severity(models.TextChoices):
        INFO = "info", "Info"
        WARNING = "warning", "Warning"
        CRITICAL = "critical", "Critical"

    rule = models.CharField(max_length=20, choices=Rule.choices)
    key = models.CharField(max_length=200, help_text="Rule and subject; dedup key.")
    severity = models.CharField(max_length=10, choices=Severity.choices)
    message = models.CharField(max_length=500)
    node = models.ForeignKey(
        "scheduler.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpu = models.ForeignKey(
        "scheduler.Gpu", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    job = models.ForeignKey(
        "scheduler.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    project = models.ForeignKey(
        "portal.Project", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    data = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"],
                condition=models.Q(resolved_at__isnull=True),
                name="alert_one_open_per_key",
                violation_error_message="This alert is already open.",
            )
        ]
        indexes = [models.Index(fields=["resolved_at", "rule"], name="alert_open_rule_idx")]

    def __str__(self) -> str:
        return f"{self.key} ({'open' if self.resolved_at is None else 'resolved'})"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


class Notification(models.Model):
    """An in-app message to one user (an alert opened for something they own or operate)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    alert = models.ForeignKey(
        Alert, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    title = models.CharField(max_length=200)
    body = models.CharField(max_length=1000)
    url = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField()
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["user", "read_at"], name="notification_user_read_idx")]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.title}"
