"""Operator admin for the catalog and the fleet."""

from __future__ import annotations

from django.contrib import admin

from portal.admin import AuditedAdmin
from scheduler.models import Gpu, GpuModel, Node, Pool


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


@admin.register(Pool)
class PoolAdmin(AuditedAdmin):
    list_display = ["name", "queue_policy", "scorer", "backfill", "preemption"]
    search_fields = ["name"]


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
    readonly_fields = [
        "last_heartbeat_at",
        "created_at",
        "updated_at",
        "driver_version",
        "cuda_version",
    ]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(AuditedAdmin):
    list_display = ["__str__", "model", "uuid", "sharing_mode", "oversubscription", "health"]
    list_filter = ["model", "sharing_mode", "health", "node__pool"]
    search_fields = ["uuid", "node__name"]
    list_select_related = ["node", "model"]
