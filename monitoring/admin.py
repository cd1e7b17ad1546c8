"""Admin for alerts and notifications (rollups are read through the pages and the API)."""

from django.contrib import admin

from monitoring.models import Alert, FleetSnapshot, Notification


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("key", "rule", "severity", "opened_at", "last_seen_at", "resolved_at")
    list_filter = ("rule", "severity")
    search_fields = ("key", "message")
    raw_id_fields = ("node", "gpu", "job", "project")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("user", "title", "created_at", "read_at")
    raw_id_fields = ("user", "alert")


@admin.register(FleetSnapshot)
class FleetSnapshotAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("at", "model_name", "free_gpus", "largest_gang", "frag_ratio")


from monitoring.models import ClusterRollup, GpuRollup, RollupFlush  # noqa: E402
from portal.admin import ReadOnlyAdmin  # noqa: E402


@admin.register(GpuRollup)
class GpuRollupAdmin(ReadOnlyAdmin):
    list_display = ["__str__"]


@admin.register(ClusterRollup)
class ClusterRollupAdmin(ReadOnlyAdmin):
    list_display = ["__str__"]


@admin.register(RollupFlush)
class RollupFlushAdmin(ReadOnlyAdmin):
    list_display = ["__str__"]
