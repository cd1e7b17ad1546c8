"""GPU catalog and inventory: what GPUs exist as products, and which ones the fleet has."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

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
        return self.memory_gb * 1000 * 1000 * 1000 // (1024 * 1024)

    @property
    def supports_mig(self) -> bool:
        return bool(self.mig_profiles)


class Pool(models.Model):
    """A group of nodes scheduled together, with its own queue policy and scorer."""

    class QueuePolicy(models.TextChoices):
        FCFS = "fcfs", "First come, first served"
        SJF = "sjf", "Shortest job first"
        PRIORITY = "priority", "Priority with aging"
        FAIRSHARE = "fairshare", "Fair share"

    name = models.SlugField(max_length=50, unique=True)
    description = models.CharField(max_length=200, blank=True)
    queue_policy = models.CharField(
        max_length=16, choices=QueuePolicy.choices, default=QueuePolicy.PRIORITY
    )
    scorer = models.CharField(max_length=32, default="default")
    backfill = models.BooleanField(default=True)
    preemption = models.BooleanField(default=True)

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
        RETIRED = "retired", "Retired"

    class Provider(models.TextChoices):
        SIMULATED = "simulated", "Simulated"
        LOCAL = "local", "Local host"

    name = models.CharField(max_length=63, unique=True)
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="nodes")
    provider = models.CharField(max_length=16, choices=Provider.choices, default=Provider.SIMULATED)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PROVISIONING)
    labels = models.JSONField(default=dict, blank=True)
    cpu_milli = models.PositiveIntegerField(help_text="Allocatable CPU in milli-cores.")
    memory_mib = models.PositiveIntegerField(help_text="Allocatable memory in MiB.")
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField(max_length=16, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool__name", "name"]

    def __str__(self) -> str:
        return self.name


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
        exclusive = self.sharing_mode == self.SharingMode.EXCLUSIVE
        return 1000 if exclusive else 1000 * self.oversubscription
