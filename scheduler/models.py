"""GPU catalog and inventory: what GPUs exist as products, and which ones the fleet has."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from scheduler.core.model import (
    GANG_REASON_LABEL,
    billed_share_milli,
    gpu_capacity_milli,
    gpu_demand_milli,
    gpus_requested,
    memory_gb_as_mib,
    runs_gang_members,
)
from scheduler.core.plan import QUEUE_POLICIES
from scheduler.core.reasons import format_duration
from scheduler.core.scorers import SCORER_NAMES

PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")


class GpuModel(models.Model):
    """A GPU product in the catalog, with its published specifications and list price."""

    name = models.SlugField(max_length=40, unique=True, help_text="e.g. H100-80GB-SXM")
    display_name = models.CharField(max_length=80)
    vendor = models.CharField(max_length=40, default="NVIDIA")
    architecture = models.CharField(max_length=40)
    compute_capability = models.CharField(max_length=8)
    memory_gb = models.PositiveIntegerField(help_text="Device memory in GB as marketed.")
    memory_bandwidth_gbs = models.PositiveIntegerField(default=0)
    precisions = models.JSONField(default=list, help_text=f"Subset of {', '.join(PRECISIONS)}.")
    tflops_fp16_bf16 = models.DecimalField(
        max_digits=7, decimal_places=1, help_text="Peak dense FP16/BF16 tensor TFLOP/s."
    )
    tflops_fp32 = models.DecimalField(max_digits=7, decimal_places=1)
    tflops_fp8 = models.DecimalField(max_digits=7, decimal_places=1, null=True, blank=True)
    mig_profiles = models.JSONField(default=list, blank=True)
    tdp_watts = models.PositiveIntegerField(default=0)
    price_per_gpu_hour = models.DecimalField(
        max_digits=8,
        decimal_places=4,
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Example list price, pay-as-you-go, USD per GPU-hour.",
    )
    nvml_names = models.JSONField(
        default=list, blank=True, help_text="Product names NVML reports for this model."
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["-memory_gb", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def memory_mib(self) -> int:
        return memory_gb_as_mib(self.memory_gb)

    @property
    def supports_mig(self) -> bool:
        return bool(self.mig_profiles)


# Words for the core's names (the names themselves come from the core's registries).
QUEUE_POLICY_LABELS = {
    "fcfs": "First come, first served",
    "sjf": "Shortest job first",
    "priority": "Priority with aging",
    "fairshare": "Fair share",
}
SCORER_LABELS = {
    "default": "Default (FGD with better tie-breaks)",
    "fgd": "Fragmentation gradient descent (FGD)",
    "best-fit": "Best fit",
    "first-fit": "First fit",
    "gpu-packing": "GPU packing",
    "gpu-clustering": "GPU clustering",
    "dot-product": "Dot product",
    "random": "Random",
}
QUEUE_POLICY_CHOICES = [(name, QUEUE_POLICY_LABELS.get(name, name)) for name in QUEUE_POLICIES]
SCORER_CHOICES = [(name, SCORER_LABELS.get(name, name)) for name in SCORER_NAMES]


class Pool(models.Model):
    """A group of nodes scheduled together, with its own queue policy and scorer (each one
    of the names the scheduler core knows: a typo is refused by the form, not by the cycle)."""

    name = models.SlugField(max_length=50, unique=True)
    description = models.CharField(max_length=200, blank=True)
    queue_policy = models.CharField(max_length=16, choices=QUEUE_POLICY_CHOICES, default="priority")
    scorer = models.CharField(max_length=32, choices=SCORER_CHOICES, default="default")

    class Backend(models.TextChoices):
        AGENTS = "agents", "Our agents"
        SLURM = "slurm", "Slurm cluster"

    backfill = models.BooleanField(default=True)
    preemption = models.BooleanField(default=True)
    backend = models.CharField(
        max_length=16,
        choices=Backend.choices,
        default=Backend.AGENTS,
        help_text="Who runs the pool's jobs: our node agents, or a Slurm cluster (its settings "
        "in the pool's Slurm section).",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    """A GPU host. Its agent reports inventory and heartbeats; the scheduler places work on it."""

    class State(models.TextChoices):
        PROVISIONING = "provisioning", "Provisioning"
        READY = "ready", "Ready"
        CORDONED = "cordoned", "Cordoned"
        DRAINING = "draining", "Draining"
        UNHEALTHY = "unhealthy", "Unhealthy"
        LOST = "lost", "Lost"
        QUARANTINED = "quarantined", "Quarantined"
        RETIRED = "retired", "Retired"

    class Provider(models.TextChoices):
        SIMULATED = "simulated", "Simulated"
        LOCAL = "local", "Local host"
        SLURM = "slurm", "Slurm node (mirrored)"

    name = models.CharField(max_length=63, unique=True)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="nodes")
    agent_token_hash = models.CharField(
        max_length=64, blank=True, db_index=True, help_text="SHA-256 of the node's agent token."
    )
    fenced = models.BooleanField(
        default=False, help_text="Came back after being lost: must stop its old work first."
    )
    autoscaler = models.ForeignKey(
        "Autoscaler", null=True, blank=True, on_delete=models.SET_NULL, related_name="nodes"
    )
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.SIMULATED)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PROVISIONING)
    labels = models.JSONField(default=dict, blank=True)
    cpu_milli = models.PositiveIntegerField(help_text="Allocatable CPU in milli-cores.")
    memory_mib = models.PositiveIntegerField(help_text="Allocatable memory in MiB.")
    address = models.CharField(
        max_length=255,
        blank=True,
        help_text="Where the node's jobs reach each other (a gang's MASTER_ADDR); the agent "
        "reports it at registration (AGENT_ADDRESS).",
    )
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField(max_length=16, blank=True)
    registered_inventory = models.JSONField(
        null=True,
        blank=True,
        help_text="The hardware the node first registered (or an operator approved since): "
        "GPU slots with model and memory, CPU, memory. Another inventory quarantines it.",
    )
    pending_inventory = models.JSONField(
        null=True,
        blank=True,
        help_text="An inventory that differs from the registered one, awaiting an operator.",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool__name", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def gang_members_refused(self) -> str:
        """Why its agent cannot run members of multi-node gangs ("" when it can): the
        reserved labels its registration records (`scheduler.nodes.inventory`)."""
        if runs_gang_members(self.labels or {}):
            return ""
        return str(self.labels.get(GANG_REASON_LABEL) or "its agent says so")


class Gpu(models.Model):
    """One device on a node, shared according to its sharing mode."""

    class SharingMode(models.TextChoices):
        EXCLUSIVE = "exclusive", "Exclusive"
        TIME_SLICE = "time_slice", "Time-slicing"
        MPS = "mps", "MPS (memory-limited)"
        MIG = "mig", "MIG"

    class Health(models.TextChoices):
        HEALTHY = "healthy", "Healthy"
        DEGRADED = "degraded", "Degraded"
        UNHEALTHY = "unhealthy", "Unhealthy"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    memory_mib = models.PositiveIntegerField()
    sharing_mode = models.CharField(
        max_length=16, choices=SharingMode.choices, default=SharingMode.EXCLUSIVE
    )
    oversubscription = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(8)],
        help_text="Capacity is 1000 milli-GPU times this factor (time-slicing).",
    )
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.HEALTHY)
    # The GPU's last fault (when it became unhealthy or its device was replaced) and when that
    # fault was corroborated: usage is credited for a fault only once it is (docs/billing.md).
    fault_at = models.DateTimeField(null=True, blank=True)
    fault_corroborated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                name="gpu_unique_index_per_node",
                violation_error_message="This node already has a GPU with that index.",
            ),
            models.CheckConstraint(
                condition=models.Q(oversubscription__gte=1) & models.Q(oversubscription__lte=8),
                name="gpu_oversubscription_range",
                violation_error_message="Oversubscription must be between 1 and 8.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"

    @property
    def capacity_milli(self) -> int:
        return gpu_capacity_milli(self.sharing_mode, self.oversubscription)

    def clean(self) -> None:
        """Sharing (mode, time-slice factor) cannot change under running shares: each share
        bills what was frozen at its placement, and the device must keep the capacity it was
        placed against. Drain the GPU (or wait for its jobs) first."""
        super().clean()
        if self.pk is None:
            return
        before = Gpu.objects.filter(pk=self.pk).values_list("sharing_mode", "oversubscription")
        old = before.first()
        if old is None or old == (self.sharing_mode, self.oversubscription):
            return
        running = self.allocations.filter(ended_at__isnull=True).count()
        if running:
            raise ValidationError(
                f"{self} has {running} running share{'s' if running != 1 else ''}: its sharing "
                "mode and time-slice factor cannot change under them (each share bills what "
                "it was placed as). Cordon or drain the node, or wait for its jobs to end, "
                "then change it."
            )


class PriorityClass(models.IntegerChoices):
    """Scheduling priority; a project's quota caps the highest class its jobs may ask for."""

    LOW = 0, "Low"
    NORMAL = 1, "Normal"
    HIGH = 2, "High"
    URGENT = 3, "Urgent"


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    QUEUED = "queued", "Queued"
    SCHEDULED = "scheduled", "Scheduled"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    PREEMPTING = "preempting", "Preempting"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    REJECTED = "rejected", "Rejected"
    LOST = "lost", "Lost"


# The states that hold GPUs: a job's allocations are active exactly while it is in one
# (entering one places it, leaving one ends them); its nodes' agents run or stop it then.
ACTIVE_STATES = (
    JobState.SCHEDULED,
    JobState.STARTING,
    JobState.RUNNING,
    JobState.PREEMPTING,
)
# Holding GPUs and not already stopping: what a preemption, a drain or a budget cap stops.
STOPPABLE_STATES = tuple(s for s in ACTIVE_STATES if s != JobState.PREEMPTING)
TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED)


SECRET_MASK = "********"  # what every page and API answer shows for a secret env value


class Job(models.Model):
    """What a researcher asked for, and where it stands."""

    class Source(models.TextChoices):
        FORM = "form", "Web form"
        API = "api", "API"
        MANIFEST = "manifest", "Kubernetes manifest"

    project = models.ForeignKey("portal.Project", on_delete=models.PROTECT, related_name="jobs")
    submitted_by = models.ForeignKey(
        "portal.User", on_delete=models.PROTECT, related_name="submitted_jobs"
    )
    name = models.CharField(max_length=100)
    state = models.CharField(
        max_length=16, choices=JobState.choices, default=JobState.PENDING, db_index=True
    )
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.API)

    # What to run
    command = models.TextField(max_length=10_000)
    image = models.CharField(max_length=300, blank=True)
    image_digest = models.CharField(
        max_length=100, blank=True, help_text="The image's digest as the node ran it (sha256:…)."
    )
    env = models.JSONField(default=dict, blank=True)
    # Write-only: shown masked to everyone (SECRET_MASK), sent only to the node that runs the job
    # in its assignment (and to the Slurm batch script of a Slurm pool's job).
    secret_env = models.JSONField(default=dict, blank=True)
    # Storage (issue 27): the project's volumes at container paths ({name, path, read_only};
    # scratch adds kind and size_gib), the checkpoint as "<volume>:<relative path>", and the
    # working directory inside the container. None of them is ever a host path.
    working_dir = models.CharField(
        max_length=500, blank=True, help_text="In the container; blank: /workspace."
    )
    volumes = models.JSONField(default=list, blank=True)
    checkpoint = models.CharField(max_length=600, blank=True)
    # Jobs from before volumes named host paths (checkpoint_dir, working_dir): kept to be read
    # on the job page, never sent to an agent or a Slurm script.
    legacy_host_paths = models.JSONField(default=dict, blank=True)

    # What it needs
    gpus = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    gpu_milli = models.PositiveIntegerField(
        default=1000,
        validators=[MinValueValidator(1), MaxValueValidator(1000)],
        help_text="Share of each GPU in milli-GPU; below 1000 only for a single GPU.",
    )
    gpu_memory_mib = models.PositiveIntegerField(
        default=0, help_text="GPU memory limit of a fractional share (MPS)."
    )
    gpu_model = models.ForeignKey(
        GpuModel, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    gpu_models = models.JSONField(
        default=list,
        blank=True,
        help_text="Catalog model names the job may land on, any of them (with no gpu_model); "
        "empty: any model meeting the other constraints.",
    )
    min_gpu_memory_gb = models.PositiveIntegerField(default=0)
    precisions = models.JSONField(default=list, blank=True)
    nodes = models.PositiveIntegerField(null=True, blank=True, help_text="Gang: exact node count.")
    gpus_per_node = models.PositiveIntegerField(null=True, blank=True)
    cpu_milli = models.PositiveIntegerField(default=0)
    memory_mib = models.PositiveIntegerField(default=0)
    shm_mib = models.PositiveIntegerField(
        default=0, help_text="Shared memory at /dev/shm in MiB (0: the runtime's default)."
    )
    pool = models.ForeignKey(Pool, null=True, blank=True, on_delete=models.PROTECT)

    # How to treat it
    priority = models.PositiveSmallIntegerField(default=1)
    preemptible = models.BooleanField(default=False)
    borrowed = models.BooleanField(
        default=False, help_text="Admitted over quota: runs only as preemptible work."
    )
    runtime_estimate_s = models.PositiveIntegerField(null=True, blank=True)
    time_limit_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Wall-clock limit in seconds; past it the job is stopped with 'time limit'.",
    )
    min_runtime_s = models.PositiveIntegerField(
        default=300, help_text="Not preempted within this long after starting."
    )
    grace_seconds = models.PositiveIntegerField(default=30)
    max_restarts = models.PositiveSmallIntegerField(default=0)
    restarts = models.PositiveSmallIntegerField(default=0)
    elastic_min = models.PositiveIntegerField(null=True, blank=True)
    elastic_max = models.PositiveIntegerField(null=True, blank=True)
    array_parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="shards"
    )
    shard_index = models.PositiveIntegerField(null=True, blank=True)
    shard_count = models.PositiveIntegerField(null=True, blank=True)
    waiting_on_dependencies = models.BooleanField(
        default=False,
        help_text="Queued behind jobs it depends on: not planned until they are done "
        "(JobDependency).",
    )

    # Where it stands
    attempt = models.PositiveIntegerField(default=0, help_text="Increments at every placement.")
    pending_reason = models.CharField(max_length=32, blank=True)
    pending_message = models.CharField(max_length=500, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    failure_reason = models.CharField(max_length=500, blank=True)
    # Bytes of output stored, and the log quota it reached (null: not truncated): the job page,
    # the API and the CLI say that later output was not kept.
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_quota_hit = models.PositiveBigIntegerField(null=True, blank=True)
    resume = models.BooleanField(default=False, help_text="Next start resumes from checkpoint.")
    preempt_deadline = models.DateTimeField(null=True, blank=True)
    rendezvous_port = models.PositiveIntegerField(
        null=True, blank=True, help_text="A gang's MASTER_PORT on rank 0's node, this attempt."
    )
    resize = models.JSONField(
        default=dict,
        blank=True,
        help_text="An elastic resize in flight: {from, to, reason, for_job, by, keep}.",
    )

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    manifest_ignored = models.JSONField(
        default=list,
        blank=True,
        help_text="Fields of the submitted Kubernetes manifest that were ignored: "
        '[{"field": ..., "why": ...}].',
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["project", "state"], name="job_project_state_idx")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(gpu_milli=1000) | models.Q(gpus=1),
                name="job_fraction_single_gpu",
                violation_error_message="A fraction of a GPU is only possible for one GPU.",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def secret_env_masked(self) -> dict[str, str]:
        """The secret variables' names, their values masked: all anyone is ever shown."""
        return {name: SECRET_MASK for name in sorted(self.secret_env)}

    @property
    def log_truncation_note(self) -> str:
        """What the job page, the API and the CLI say when output was dropped ('' if none)."""
        if self.log_quota_hit is None:
            return ""
        quota = self.log_quota_hit
        size = next(
            (
                f"{quota / unit:g} {name}"
                for name, unit in (("MiB", 1 << 20), ("KiB", 1 << 10))
                if quota >= unit
            ),
            f"{quota} bytes",
        )
        return f"[log truncated: this job's output reached its log quota of {size}; later output was not kept]"

    @property
    def gpu_count(self) -> int:
        """Whole GPUs the job occupies (a fraction counts as one device)."""
        return gpus_requested(self.gpus, self.nodes, self.gpus_per_node)

    @property
    def gpu_demand_milli(self) -> int:
        return gpu_demand_milli(self.gpus, self.nodes, self.gpus_per_node, self.gpu_milli)

    @property
    def runtime_estimate_text(self) -> str:
        return format_duration(self.runtime_estimate_s) if self.runtime_estimate_s else ""

    @property
    def has_checkpoint(self) -> bool:
        """It checkpoints to a volume, so a restart resumes from it (`resume`)."""
        return bool(self.checkpoint)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class DependencyKind(models.TextChoices):
    """Slurm's --dependency types the portal speaks (afterok, afterany)."""

    AFTER_OK = "after_ok", "after it succeeds"
    AFTER_ANY = "after_any", "after it ends"


class JobDependency(models.Model):
    """`job` may start only once `on` is done (succeeded for after_ok, ended for after_any).

    `whole_array`: `on` is an array's first job and the dependency is on every shard of it, as
    Slurm's dependency on an array job id is."""

    job = models.ForeignKey("Job", on_delete=models.CASCADE, related_name="dependencies")
    on = models.ForeignKey("Job", on_delete=models.CASCADE, related_name="dependents")
    kind = models.CharField(max_length=16, choices=DependencyKind.choices)
    whole_array = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "on"], name="job_dependency_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} {self.on_id}"


class JobEvent(models.Model):
    """One state transition (or notable fact) of a job: who, when, why."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    actor = models.ForeignKey("portal.User", null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=100)
    reason = models.CharField(max_length=500)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state}→{self.to_state} ({self.reason})"


class Allocation(models.Model):
    """A job's share of one GPU over an interval. Active while `ended_at` is null."""

    # The columns a new allocation is written with, in one multi-row insert
    # (`foundation.db.insert_rows`): by the cycle's apply, and by billing for a Slurm cluster's runs.
    WRITTEN_FIELDS = (
        "job",
        "gpu",
        "node",
        "attempt",
        "share_milli",
        "memory_mib",
        "billed_milli",
        "gpu_model",
        "borrowed",
        "started_at",
        "ended_at",
        "end_reason",
    )

    class EndReason(models.TextChoices):
        COMPLETED = "completed", "Job ended"
        CANCELLED = "cancelled", "Cancelled"
        PREEMPTED = "preempted", "Preempted"
        NODE_LOST = "node_lost", "Node lost"
        GPU_FAULT = "gpu_fault", "GPU fault"
        FAILED = "failed", "Job failed"

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    attempt = models.PositiveIntegerField()
    share_milli = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_mib = models.PositiveIntegerField(default=0)
    billed_milli = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="What the share bills (milli-GPU of one GPU), frozen at placement "
        "(scheduler.core.model.billed_share_milli); null on rows placed before it was kept.",
    )
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    borrowed = models.BooleanField(default=False)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, choices=EndReason.choices, blank=True)
    # a GPU fault's end is credited only once the fault is corroborated (a later heartbeat
    # still finds the GPU unhealthy, or an operator confirms it); a node's loss needs nothing
    fault_corroborated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at", "pk"]
        indexes = [
            models.Index(
                fields=["gpu"],
                condition=models.Q(ended_at__isnull=True),
                name="alloc_active_gpu_idx",
            ),
            models.Index(fields=["job", "attempt"], name="alloc_job_attempt_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "gpu", "attempt"],
                name="alloc_unique_job_gpu_attempt",
                violation_error_message="This job already holds this GPU in this attempt.",
            ),
            models.CheckConstraint(
                condition=models.Q(ended_at__isnull=True)
                | models.Q(ended_at__gte=models.F("started_at")),
                name="alloc_ends_after_start",
                violation_error_message="An allocation cannot end before it starts.",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} on gpu {self.gpu_id} ({self.share_milli}m)"

    def billed_share(self) -> int:
        """What this share bills (milli-GPU): as frozen at placement; for a row placed before
        the value was kept, the rule applied to its GPU as it is now."""
        if self.billed_milli is not None:
            return self.billed_milli
        return billed_share_milli(
            self.share_milli, self.gpu.capacity_milli, self.memory_mib, self.gpu.memory_mib
        )


class JobMember(models.Model):
    """One node's part of a gang (a job placed on several nodes), for one attempt: its rank
    and what became of it. A single-node job has none."""

    class State(models.TextChoices):
        SCHEDULED = "scheduled", "Scheduled"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        STOPPED = "stopped", "Stopped"
        LOST = "lost", "Lost"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="members")
    attempt = models.PositiveIntegerField()
    rank = models.PositiveIntegerField(help_text="NODE_RANK; 0 hosts the rendezvous.")
    first_rank = models.PositiveIntegerField(help_text="RANK: the global rank of its first GPU.")
    gpus = models.PositiveIntegerField(help_text="LOCAL_WORLD_SIZE.")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="members")
    state = models.CharField(max_length=12, choices=State.choices, default=State.SCHEDULED)
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "attempt", "rank"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "rank"],
                name="jobmember_unique_rank",
                violation_error_message="This attempt already has a member of that rank.",
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} rank {self.rank}"


class LogChunk(models.Model):
    """A piece of a job's output, shipped by the agent. Unique per attempt and sequence."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    attempt = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    stream = models.CharField(max_length=6, default="stdout")
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["attempt", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "attempt", "stream", "seq"],
                name="logchunk_unique_seq",
                violation_error_message="This log chunk was already received.",
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} {self.stream} #{self.seq}"


class NodeEvent(models.Model):
    """Something that happened to a node or one of its GPUs: health changes, operator actions."""

    class Severity(models.TextChoices):
        INFO = "info", "Info"
        WARNING = "warning", "Warning"
        CRITICAL = "critical", "Critical"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.INFO)
    kind = models.CharField(max_length=40)
    message = models.CharField(max_length=500)
    acknowledged = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.node.name}: {self.kind}"


class Autoscaler(models.Model):
    """Keeps a pool's nodes of one GPU model between min and max, with a warm pool of idle
    ready nodes; adds nodes when queued work cannot fit, removes idle ones after a TTL."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="autoscalers")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT)
    provider = models.CharField(
        max_length=16, choices=Node.Provider.choices, default=Node.Provider.SIMULATED
    )
    gpus_per_node = models.PositiveSmallIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(16)]
    )
    min_nodes = models.PositiveIntegerField(default=0)
    max_nodes = models.PositiveIntegerField(default=4)
    warm_nodes = models.PositiveIntegerField(default=1, help_text="Idle ready nodes to keep.")
    idle_ttl_s = models.PositiveIntegerField(default=600, help_text="Remove idle nodes after.")
    provisioning_time_s = models.PositiveIntegerField(
        default=120, help_text="How long a new node takes to be ready."
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["pool__name", "gpu_model__name"]
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "gpu_model"],
                name="autoscaler_unique_pool_model",
                violation_error_message="This pool already has an autoscaler for that GPU model.",
            ),
            models.CheckConstraint(
                condition=models.Q(min_nodes__lte=models.F("max_nodes")),
                name="autoscaler_min_le_max",
                violation_error_message="Minimum nodes cannot exceed maximum nodes.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pool.name}/{self.gpu_model.name}"


class AutoscalerDecision(models.Model):
    """One autoscaler decision and why, kept for operators."""

    class Action(models.TextChoices):
        SCALE_UP = "scale_up", "Scale up"
        SCALE_DOWN = "scale_down", "Scale down"
        HOLD = "hold", "Hold"

    autoscaler = models.ForeignKey(Autoscaler, on_delete=models.CASCADE, related_name="decisions")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=12, choices=Action.choices)
    count = models.PositiveIntegerField(default=0)
    nodes = models.JSONField(default=list, blank=True)
    reason = models.CharField(max_length=500)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.autoscaler}: {self.action} {self.count}"


class Quota(models.Model):
    """A project's limits. Null means unlimited. Enforced when jobs are admitted.

    Moved from portal with its rows: the table keeps its name."""

    project = models.OneToOneField("portal.Project", on_delete=models.CASCADE, related_name="quota")
    max_gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="Concurrent GPUs across all models (blank: unlimited)."
    )
    gpu_hours_per_month = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPU-hours per calendar month (blank: unlimited)."
    )
    max_gpus_per_job = models.PositiveIntegerField(
        default=8, validators=[MinValueValidator(1), MaxValueValidator(4096)]
    )
    max_priority = models.PositiveSmallIntegerField(
        choices=PriorityClass.choices, default=PriorityClass.NORMAL
    )
    allow_borrowing = models.BooleanField(
        default=True, help_text="Over-quota work may run as preemptible when GPUs are idle."
    )
    max_gpus_per_member = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Set by the project's owners, within the project's concurrent GPUs: what one "
        "member's queued and running jobs may ask for at once (blank: no cap).",
    )
    log_quota_bytes = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1024)],
        help_text="Output kept per job, in bytes (blank: the portal's default, "
        "JOB_LOG_QUOTA_BYTES); later output is dropped and the job says so.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "portal_quota"

    def __str__(self) -> str:
        return f"Quota of {self.project}"


class QuotaModelLimit(models.Model):
    """Concurrent GPUs of one model a project may hold."""

    quota = models.ForeignKey(Quota, on_delete=models.CASCADE, related_name="model_limits")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.CASCADE)
    max_gpus = models.PositiveIntegerField()

    class Meta:
        db_table = "portal_quotamodellimit"
        constraints = [
            models.UniqueConstraint(
                fields=["quota", "gpu_model"],
                name="quota_model_limit_unique",
                violation_error_message="This GPU model already has a limit in this quota.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model}: {self.max_gpus}"


class RequestStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    DECLINED = "declined", "Declined"


class QuotaRequest(models.Model):
    """An owner's request for more quota; an operator approves (the quota changes) or declines
    it with a reason. Blank fields ask for no change."""

    project = models.ForeignKey(
        "portal.Project", on_delete=models.CASCADE, related_name="quota_requests"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    max_gpus = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000)]
    )
    gpu_hours_per_month = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(10_000_000)]
    )
    gpu_model = models.ForeignKey(
        GpuModel, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    model_max_gpus = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100_000)]
    )
    justification = models.TextField(max_length=2000)
    status = models.CharField(
        max_length=10, choices=RequestStatus.choices, default=RequestStatus.PENDING
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(max_length=2000, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "created_at"], name="quota_request_status")]

    def __str__(self) -> str:
        return f"Quota request {self.pk} of {self.project} ({self.status})"

    def changes(self) -> list[str]:
        out = []
        if self.max_gpus is not None:
            out.append(f"concurrent GPUs → {self.max_gpus}")
        if self.gpu_hours_per_month is not None:
            out.append(f"GPU-hours per month → {self.gpu_hours_per_month}")
        if self.gpu_model is not None and self.model_max_gpus is not None:
            out.append(f"{self.gpu_model.name} GPUs → {self.model_max_gpus}")
        return out


class JobTemplate(models.Model):
    """A job saved to submit again: the request as the API takes it (no project, no state)."""

    project = models.ForeignKey(
        "portal.Project", on_delete=models.CASCADE, related_name="job_templates"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    name = models.CharField(max_length=100)
    body = models.JSONField(help_text="The job's fields as POST /api/v1/jobs takes them.")
    source_job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"],
                name="job_template_unique_name",
                violation_error_message="This project already has a template of that name.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.project})"


# The Slurm execution backend's rows (pool settings, job links) live with it.
from scheduler.backends.slurm.models import SlurmJob, SlurmPool  # noqa: E402,F401


class AllowedRegistry(models.Model):
    """A container registry jobs' images may come from, besides the IMAGE_REGISTRIES setting;
    an image from any other is refused at submission, naming its registry. Operators curate
    the list (the admin)."""

    host = models.CharField(
        max_length=253,
        unique=True,
        help_text="As an image reference names it: docker.io (the default), nvcr.io, "
        "ghcr.io, registry.example.org:5000, localhost.",
    )
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["host"]
        verbose_name_plural = "allowed registries"

    def __str__(self) -> str:
        return self.host


class CuratedImage(models.Model):
    """An image operators offer in the submit form, with its CUDA and framework versions.
    Warm nodes keep the active ones pulled (the heartbeat answer lists them), so a job's
    start is not a cold pull."""

    reference = models.CharField(
        max_length=300, unique=True, help_text="e.g. nvcr.io/nvidia/pytorch:24.05-py3"
    )
    name = models.CharField(max_length=100)
    cuda_version = models.CharField(max_length=16, blank=True)
    framework = models.CharField(max_length=50, blank=True, help_text="e.g. PyTorch")
    framework_version = models.CharField(max_length=32, blank=True)
    is_active = models.BooleanField(default=True, help_text="Shown in the form and kept pulled.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def label(self) -> str:
        """What the form shows: name, CUDA and framework versions."""
        parts = [self.name]
        if self.cuda_version:
            parts.append(f"CUDA {self.cuda_version}")
        if self.framework:
            parts.append(f"{self.framework} {self.framework_version}".strip())
        return " · ".join(parts)
