"""Operator admin for tenancy. Changes made here are audited like any other."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.db.models import Model
from django.forms import ModelForm
from django.http import HttpRequest

from portal.audit import audit_record
from portal.forms import AdminLoginForm
from portal.models import (
    ApiToken,
    AuditEvent,
    IdempotencyKey,
    Invitation,
    Membership,
    NotificationPreference,
    Project,
    ProjectWebhook,
    User,
    WebhookDelivery,
)


class AuditedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Writes an AuditEvent for every save and delete done through the admin."""

    def save_model(self, request: HttpRequest, obj: Model, form: ModelForm, change: bool) -> None:  # type: ignore[type-arg]
        super().save_model(request, obj, form, change)
        audit_record(
            actor=request.user,  # type: ignore[arg-type]
            action=f"admin.{obj._meta.model_name}.{'change' if change else 'add'}",
            target=obj,
            project=getattr(obj, "project", None) if not isinstance(obj, Project) else obj,
            data={"fields": sorted(form.changed_data)},
            remote_addr=request.META.get("REMOTE_ADDR"),
        )

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        audit_record(
            actor=request.user,  # type: ignore[arg-type]
            action=f"admin.{obj._meta.model_name}.delete",
            target=obj,
            data={"repr": str(obj)},
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        super().delete_model(request, obj)


admin.site.login_form = AdminLoginForm


@admin.register(User)
class UserAdmin(BaseUserAdmin):  # type: ignore[type-arg]
    ordering = ["email"]
    list_display = ["email", "full_name", "is_staff", "is_active", "date_joined", "last_login"]
    list_filter = ["is_staff", "is_active"]
    search_fields = ["email", "full_name"]
    readonly_fields = ["date_joined", "last_login"]
    fieldsets = (
        (None, {"fields": ("email", "password", "full_name")}),
        ("Access", {"fields": ("is_active", "is_staff", "is_superuser", "groups")}),
        ("Dates", {"fields": ("date_joined", "last_login")}),
    )
    add_fieldsets = ((None, {"classes": ("wide",), "fields": ("email", "password1", "password2")}),)


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    readonly_fields = ["created_at"]


@admin.register(Project)
class ProjectAdmin(AuditedAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["created_at"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    list_display = ["project", "user", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__email", "project__slug"]
    autocomplete_fields = ["user", "project"]
    readonly_fields = ["created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__email", "prefix"]
    readonly_fields = ["user", "name", "prefix", "token_hash", "created_at", "last_used_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are issued to their owner, who alone sees the secret


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["created_at", "actor_label", "action", "project", "target_type", "target_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["actor_label", "action", "target_id"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """For rows that only the system writes (ledgers, rollups, logs): operators look, never edit."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    """Keys of retried API requests (24 hours); the answers are sealed with the keys."""

    list_display = ["created_at", "user", "method", "path", "status_code"]
    list_filter = ["method", "status_code"]
    search_fields = ["user__email", "path"]
    exclude = ["response_sealed"]


@admin.register(Invitation)
class InvitationAdmin(ReadOnlyAdmin):
    """Owners invite and revoke on the project page; operators look here."""

    list_display = [
        "email",
        "project",
        "role",
        "created_at",
        "expires_at",
        "accepted_at",
        "revoked_at",
    ]
    list_filter = ["role"]
    search_fields = ["email", "project__slug"]
    exclude = ["token_hash"]


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(ReadOnlyAdmin):
    """Each user's e-mail choices per kind of notice; users set them on their own page."""

    list_display = ["user", "kind", "email"]
    list_filter = ["kind", "email"]
    search_fields = ["user__email"]


@admin.register(ProjectWebhook)
class ProjectWebhookAdmin(ReadOnlyAdmin):
    """Owners set their project's webhook; the signing secret is never shown here."""

    list_display = ["project", "url", "is_active", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["project__slug", "url"]
    exclude = ["secret"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    """Deliveries of project webhooks and their retries."""

    list_display = ["webhook", "kind", "status", "attempts"]
    list_filter = ["status", "kind"]
    search_fields = ["webhook__project__slug"]
