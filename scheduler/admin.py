"""Operator admin for the catalog, the fleet and the projects' quotas."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from portal.admin import AuditedAdmin, ReadOnlyAdmin
from portal.errors import DomainError
from scheduler.models import (
    Allocation,
    AllowedRegistry,
    Autoscaler,
    AutoscalerDecision,
    CuratedImage,
    Gpu,
    GpuModel,
    Job,
    JobDependency,
    JobEvent,
    JobMember,
    JobTemplate,
    LogChunk,
    Node,
    NodeEvent,
    Pool,
    Quota,
    QuotaModelLimit,
    QuotaRequest,
    SlurmJob,
    SlurmPool,
)
from scheduler.nodes import node_inventory_approve


@admin.register(GpuModel)
class GpuModelAdmin(AuditedAdmin):
    list_display = [
        "name",
        "architecture",
        "memory_gb",
        "tflops_fp16_bf16",
        "tflops_fp32",
        "price_per_gpu_hour",
        "is_active",
    ]
    list_filter = ["architecture", "vendor", "is_active"]
    list_editable = ["price_per_gpu_hour", "is_active"]
    search_fields = ["name", "display_name"]


class SlurmPoolInline(admin.StackedInline):  # type: ignore[type-arg]
    """The Slurm cluster a pool fronts (only read when the pool's backend is Slurm)."""

    model = SlurmPool
    extra = 0
    max_num = 1
    readonly_fields = ["last_sync_at", "last_error"]


@admin.register(Pool)
class PoolAdmin(AuditedAdmin):
    list_display = ["name", "backend", "queue_policy", "scorer", "backfill", "preemption"]
    list_filter = ["backend"]
    search_fields = ["name"]
    inlines = [SlurmPoolInline]


class GpuInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "model", "memory_mib", "sharing_mode", "oversubscription", "health"]


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = [
        "name",
        "pool",
        "provider",
        "state",
        "cpu_milli",
        "memory_mib",
        "last_heartbeat_at",
    ]
    list_filter = ["state", "provider", "pool"]
    search_fields = ["name"]
    # state changes go through the node state machine (the operator pages' actions)
    readonly_fields = [
        "state",
        "last_heartbeat_at",
        "created_at",
        "updated_at",
        "driver_version",
        "cuda_version",
        "registered_inventory",
        "pending_inventory",
    ]
    inlines = [GpuInline]
    actions = ["approve_inventory"]

    @admin.action(description="Approve the new inventory of quarantined nodes")
    def approve_inventory(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset.filter(state=Node.State.QUARANTINED):
            try:
                node_inventory_approve(
                    actor=request.user,  # type: ignore[arg-type]
                    node=node,
                    remote_addr=request.META.get("REMOTE_ADDR"),
                )
            except DomainError as exc:
                self.message_user(request, f"{node.name}: {exc.message}", level="error")
            else:
                self.message_user(request, f"{node.name}: inventory approved; ready.")


@admin.register(Gpu)
class GpuAdmin(AuditedAdmin):
    list_display = ["__str__", "model", "uuid", "sharing_mode", "oversubscription", "health"]
    list_filter = ["model", "sharing_mode", "health", "node__pool"]
    search_fields = ["uuid", "node__name"]
    list_select_related = ["node", "model"]


class JobEventInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ("created_at", "from_state", "to_state", "actor_label", "reason")
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class JobDependencyInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobDependency
    fk_name = "job"
    extra = 0
    can_delete = False
    readonly_fields = ("on", "kind", "whole_array")
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class JobMemberInline(admin.TabularInline):  # type: ignore[type-arg]
    model = JobMember
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Read-only: jobs change state only through the scheduler's services."""

    list_display = ["id", "name", "project", "state", "gpus", "gpu_model", "priority", "created_at"]
    list_filter = ["state", "gpu_model", "preemptible", "borrowed", "source"]
    search_fields = ["name", "project__slug", "submitted_by__email"]
    list_select_related = ["project", "gpu_model"]
    date_hierarchy = "created_at"
    inlines = [JobEventInline, JobDependencyInline, JobMemberInline]
    exclude = ["secret_env"]  # write-only, for operators too: the masked names instead
    readonly_fields = ["secret_env_names"]

    @admin.display(description="Secret environment")
    def secret_env_names(self, obj: Job) -> str:
        return ", ".join(f"{k}={v}" for k, v in obj.secret_env_masked.items()) or "-"

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["job", "gpu", "node", "share_milli", "started_at", "ended_at", "end_reason"]
    list_filter = ["end_reason", "gpu_model", "borrowed"]
    search_fields = ["job__name", "node__name", "gpu__uuid"]
    list_select_related = ["job", "gpu", "gpu__node", "node"]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(NodeEvent)
class NodeEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["created_at", "node", "gpu", "severity", "kind", "message", "acknowledged"]
    list_filter = ["severity", "kind", "acknowledged"]
    search_fields = ["node__name", "message"]
    readonly_fields = ["created_at", "node", "gpu", "severity", "kind", "message"]


class AutoscalerDecisionInline(admin.TabularInline):  # type: ignore[type-arg]
    model = AutoscalerDecision
    extra = 0
    can_delete = False
    readonly_fields = ["created_at", "action", "count", "nodes", "reason"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Autoscaler)
class AutoscalerAdmin(AuditedAdmin):
    list_display = [
        "__str__",
        "provider",
        "min_nodes",
        "max_nodes",
        "warm_nodes",
        "idle_ttl_s",
        "enabled",
    ]
    list_filter = ["enabled", "provider", "pool"]
    inlines = [AutoscalerDecisionInline]


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "job", "from_state", "to_state", "actor_label", "reason"]
    list_filter = ["to_state"]
    search_fields = ["job__name", "reason", "actor_label"]
    list_select_related = ["job"]


@admin.register(SlurmJob)
class SlurmJobAdmin(ReadOnlyAdmin):
    list_display = ["slurm_job_id", "job", "pool", "state", "reason", "restarts", "seen_at"]
    list_filter = ["pool", "state"]
    search_fields = ["slurm_job_id", "job__name"]
    list_select_related = ["job", "pool"]


@admin.register(LogChunk)
class LogChunkAdmin(ReadOnlyAdmin):
    list_display = ["job", "attempt", "stream", "seq", "created_at"]
    list_filter = ["stream"]
    search_fields = ["job__name"]


@admin.register(AutoscalerDecision)
class AutoscalerDecisionAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "autoscaler", "action", "count", "reason"]
    list_filter = ["action", "autoscaler"]


class QuotaModelLimitInline(admin.TabularInline):  # type: ignore[type-arg]
    model = QuotaModelLimit
    extra = 0


@admin.register(Quota)
class QuotaAdmin(AuditedAdmin):
    list_display = [
        "project",
        "max_gpus",
        "gpu_hours_per_month",
        "max_gpus_per_job",
        "max_priority",
        "allow_borrowing",
        "updated_at",
    ]
    list_filter = ["allow_borrowing", "max_priority"]
    search_fields = ["project__slug", "project__name"]
    readonly_fields = ["updated_at"]
    inlines = [QuotaModelLimitInline]


@admin.register(QuotaModelLimit)
class QuotaModelLimitAdmin(AuditedAdmin):
    list_display = ["quota", "gpu_model", "max_gpus"]
    list_filter = ["gpu_model"]
    search_fields = ["quota__project__slug"]


@admin.register(QuotaRequest)
class QuotaRequestAdmin(ReadOnlyAdmin):
    """Decided on the operators' requests page (/ops/requests/), where approving applies it."""

    list_display = ["project", "requested_by", "status", "created_at", "decided_by", "decided_at"]
    list_filter = ["status"]
    search_fields = ["project__slug", "requested_by__email"]


@admin.register(AllowedRegistry)
class AllowedRegistryAdmin(AuditedAdmin):
    """The registries jobs' images may come from (anything else is refused at submission)."""

    list_display = ["host", "note"]
    search_fields = ["host"]


@admin.register(CuratedImage)
class CuratedImageAdmin(AuditedAdmin):
    """The images the submit form offers and warm nodes keep pulled."""

    list_display = [
        "name",
        "reference",
        "cuda_version",
        "framework",
        "framework_version",
        "is_active",
    ]
    list_filter = ["is_active", "framework"]
    list_editable = ["is_active"]
    search_fields = ["name", "reference"]


@admin.register(JobTemplate)
class JobTemplateAdmin(ReadOnlyAdmin):
    """Members save and delete templates on their pages; operators look here."""

    list_display = ["name", "project", "created_by", "created_at"]
    search_fields = ["name", "project__slug"]
    list_select_related = ["project", "created_by"]
