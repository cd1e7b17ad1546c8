"""The rows of the Slurm execution backend (models of the scheduler app)."""

from __future__ import annotations

from django.db import models


def default_qos_by_priority() -> dict[str, str]:
    return {"0": "low", "1": "normal", "2": "high", "3": "urgent"}


class SlurmPool(models.Model):
    """How a pool reaches its Slurm cluster. One per pool whose backend is Slurm."""

    pool = models.OneToOneField("scheduler.Pool", on_delete=models.CASCADE, related_name="slurm")
    cluster_name = models.CharField(max_length=64, help_text="Slurm's ClusterName.")
    conf_path = models.CharField(
        max_length=500,
        help_text="The slurm.conf the portal's Slurm commands read (SLURM_CONF): it names the "
        "controller (SlurmctldHost, SlurmctldPort) and the authentication (munge socket).",
    )
    partitions = models.CharField(
        max_length=200, default="gpu", help_text="Partition(s) jobs go to, comma separated."
    )
    gpu_types = models.JSONField(
        default=dict,
        blank=True,
        help_text='Catalog GPU model name → Slurm GRES type, e.g. {"A100-80GB-SXM": "a100"}.',
    )
    qos_by_priority = models.JSONField(
        default=default_qos_by_priority,
        help_text='Priority class (0 low … 3 urgent) → QOS, e.g. {"1": "normal"}.',
    )
    preemptible_qos = models.CharField(
        max_length=64,
        default="scavenger",
        help_text="The QOS of preemptible jobs: one the others' QOS may preempt (requeue).",
    )
    output_dir = models.CharField(
        max_length=500,
        help_text="A directory on the filesystem the portal shares with the cluster: job output "
        "files are written here by Slurm and read here by the portal.",
    )
    storage_root = models.CharField(
        max_length=500,
        blank=True,
        help_text="Where the project volumes live on the cluster's shared filesystem: a volume "
        "is <storage_root>/v<id> (the same files as the portal's STORAGE_SHARED_ROOT when both "
        "mount one filesystem). Blank: jobs of this pool cannot mount volumes.",
    )
    submit_user = models.CharField(
        max_length=64,
        default="root",
        help_text="The Unix user the portal's sbatch runs as (associations are made for it).",
    )
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        app_label = "scheduler"

    def __str__(self) -> str:
        return f"Slurm cluster {self.cluster_name} for {self.pool}"

    @property
    def partition_list(self) -> list[str]:
        return [p.strip() for p in self.partitions.split(",") if p.strip()]


class SlurmJob(models.Model):
    """Our job's Slurm batch job: the id Slurm gave it and what Slurm last said about it."""

    job = models.OneToOneField("scheduler.Job", on_delete=models.CASCADE, related_name="slurm")
    pool = models.ForeignKey("scheduler.Pool", on_delete=models.PROTECT, related_name="+")
    slurm_job_id = models.CharField(
        max_length=32, db_index=True, help_text="e.g. 1234, or 1234_5 for an array task."
    )
    state = models.CharField(max_length=32, blank=True, help_text="Slurm's state, as it said.")
    reason = models.CharField(max_length=64, blank=True, help_text="Slurm's state reason.")
    restarts = models.PositiveIntegerField(default=0, help_text="Requeues seen (restart_cnt).")
    nodes = models.CharField(max_length=500, blank=True)
    output_path = models.CharField(max_length=500, blank=True)
    submitted_at = models.DateTimeField()
    seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "scheduler"
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "slurm_job_id"],
                name="slurmjob_unique_pool_id",
                violation_error_message="This Slurm job is already linked.",
            )
        ]

    def __str__(self) -> str:
        return f"Slurm job {self.slurm_job_id} (job {self.job_id})"
