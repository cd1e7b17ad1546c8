"""Operator admin: volumes and requests are read-only here (services write them, audited);
a project's storage quota may be set here (audited) as on the operations' Storage page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal.admin import AuditedAdmin
from storage.models import StorageQuota, StorageQuotaRequest, Volume


class _ReadOnly(AuditedAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Volume)
class VolumeAdmin(_ReadOnly):
    list_display = ("name", "project", "kind", "size_gib", "is_dataset", "fill_state", "state")
    list_filter = ("kind", "state", "is_dataset")
    search_fields = ("name", "project__slug")


@admin.register(StorageQuota)
class StorageQuotaAdmin(AuditedAdmin):
    list_display = ("project", "max_gib", "updated_at", "updated_by")
    search_fields = ("project__slug",)
    readonly_fields = ("updated_at", "updated_by")


@admin.register(StorageQuotaRequest)
class StorageQuotaRequestAdmin(_ReadOnly):
    list_display = ("project", "max_gib", "status", "created_at", "decided_at")
    list_filter = ("status",)
