"""Operator admin for prices, accounts, plans, credits and the ledger. Changes are audited;
the ledger and invoices are read-only here (they are written by metering and the close)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Model
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils import timezone

from billing import pricing, services
from billing.models import (
    Adjustment,
    BillingAccount,
    Budget,
    BudgetAlert,
    CreditGrant,
    Invoice,
    InvoiceLine,
    InvoiceSequence,
    MonthClose,
    Notification,
    PriceVersion,
    ProjectBilling,
    ReservationRequest,
    ReservedPlan,
    StoragePrice,
    StorageUsageRecord,
    StripeEvent,
    UsageRecord,
)
from portal.admin import AuditedAdmin


class ReadOnlyAdmin(AuditedAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PriceVersion)
class PriceVersionAdmin(AuditedAdmin):
    list_display = [
        "gpu_model",
        "effective_from",
        "on_demand_per_gpu_hour",
        "preemptible_discount",
        "reserved_discount_1m",
        "reserved_discount_12m",
        "reserved_discount_36m",
        "note",
    ]
    list_filter = ["gpu_model"]
    date_hierarchy = "effective_from"
    readonly_fields = ["created_at", "created_by"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # a version already in effect has priced usage: publish a new one instead
        if obj is not None and obj.effective_from <= timezone.now():
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.effective_from <= timezone.now():
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Model, form: ModelForm, change: bool) -> None:  # type: ignore[type-arg]
        assert isinstance(obj, PriceVersion)
        if obj.effective_from < pricing.floor_second(timezone.now()):
            from django.core.exceptions import ValidationError

            raise ValidationError("A price change cannot take effect in the past.")
        obj.created_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)


class ProjectBillingInline(admin.TabularInline):  # type: ignore[type-arg]
    model = ProjectBilling
    extra = 0
    autocomplete_fields = ["project"]


@admin.register(BillingAccount)
class BillingAccountAdmin(AuditedAdmin):
    list_display = [
        "name",
        "email",
        "currency",
        "tax_rate",
        "stripe_customer_id",
        "payment_failed_at",
        "created_at",
    ]
    search_fields = ["name", "email", "stripe_customer_id"]
    list_filter = ["currency"]
    readonly_fields = ["created_at", "stripe_customer_id"]
    inlines = [ProjectBillingInline]


@admin.register(ProjectBilling)
class ProjectBillingAdmin(AuditedAdmin):
    list_display = ["project", "account"]
    search_fields = ["project__slug", "account__name"]
    autocomplete_fields = ["project", "account"]


@admin.register(ReservedPlan)
class ReservedPlanAdmin(AuditedAdmin):
    list_display = [
        "account",
        "project",
        "gpu_model",
        "gpus",
        "term_months",
        "starts_at",
        "ends_at",
        "monthly_fee",
    ]
    list_filter = ["gpu_model", "term_months"]
    search_fields = ["account__name", "project__slug"]
    readonly_fields = ["ends_at", "monthly_fee", "price_version", "supersedes", "created_at"]
    autocomplete_fields = ["account", "project"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        """Once a plan exists only its project may change: the rest is frozen under its fee
        (a change of GPUs or start is a new plan version, `reserved_plan_revise`)."""
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None:
            fields += ["account", "gpu_model", "gpus", "term_months", "starts_at"]
        return fields

    def save_model(self, request: HttpRequest, obj: Model, form: ModelForm, change: bool) -> None:  # type: ignore[type-arg]
        assert isinstance(obj, ReservedPlan)
        if change:
            super().save_model(request, obj, form, change)
            return
        # the fee and end come from the price list, through the one service that computes them
        plan = services.reserved_plan_create(
            actor=request.user,  # type: ignore[arg-type]
            account=obj.account,
            gpu_model=obj.gpu_model,
            gpus=obj.gpus,
            term_months=obj.term_months,
            starts_at=obj.starts_at,
            project=obj.project,
        )
        obj.pk = plan.pk


@admin.register(CreditGrant)
class CreditGrantAdmin(AuditedAdmin):
    list_display = ["account", "amount", "description", "granted_at", "expires_at"]
    search_fields = ["account__name", "description"]
    autocomplete_fields = ["account"]


@admin.register(Adjustment)
class AdjustmentAdmin(AuditedAdmin):
    list_display = ["account", "amount", "description", "created_at", "invoice", "source_invoice"]
    search_fields = ["account__name", "description"]
    autocomplete_fields = ["account"]
    raw_id_fields = ["source_invoice", "source_allocation"]  # what a late correction corrects
    readonly_fields = ["invoice"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # once on an issued invoice an adjustment is part of it: correct it with another one
        if obj is not None and obj.invoice_id is not None:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.invoice_id is not None:
            return False
        return super().has_delete_permission(request, obj)


@admin.register(Budget)
class BudgetAdmin(AuditedAdmin):
    list_display = [
        "project",
        "monthly_amount",
        "hard_cap",
        "preemptible_allowance_percent",
        "updated_at",
    ]
    list_filter = ["hard_cap"]
    search_fields = ["project__slug"]


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyAdmin):
    list_display = ["project", "period_start", "threshold", "spent", "budget", "created_at"]
    list_filter = ["threshold"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "project", "kind", "level", "message"]
    list_filter = ["kind", "level"]
    search_fields = ["project__slug", "message"]


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = [
        "slice_start",
        "seconds",
        "project",
        "job",
        "gpu_model",
        "tier",
        "billed_milli",
        "rate",
        "amount",
        "fault_credit",
        "invoice",
    ]
    list_filter = ["tier", "fault_credit", "gpu_model", "period_start"]
    search_fields = ["project__slug", "job__name"]
    list_select_related = ["project", "job", "gpu_model", "invoice"]
    show_full_result_count = False


class InvoiceLineInline(admin.TabularInline):  # type: ignore[type-arg]
    model = InvoiceLine
    extra = 0
    can_delete = False
    readonly_fields = [
        "position",
        "kind",
        "description",
        "gpu_hours",
        "unit_price",
        "amount",
        "record_count",
        "stripe_item_id",
    ]
    exclude = ["gpu_model", "tier", "usage_period_start", "plan"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(AuditedAdmin):
    list_display = [
        "number",
        "account",
        "period_start",
        "status",
        "total",
        "issued_at",
        "emailed_at",
        "paid_at",
        "stripe_invoice_id",
    ]
    list_filter = ["status", "period_start"]
    search_fields = ["number", "account__name", "stripe_invoice_id"]
    inlines = [InvoiceLineInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Invoice._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["received_at", "event_id", "type", "created", "outcome"]
    list_filter = ["type"]
    search_fields = ["event_id"]


from billing.models import AllocationMeter, CreditApplication, InvoiceLine  # noqa: E402


@admin.register(AllocationMeter)
class AllocationMeterAdmin(ReadOnlyAdmin):
    list_display = ["__str__"]


@admin.register(CreditApplication)
class CreditApplicationAdmin(ReadOnlyAdmin):
    list_display = ["__str__"]


@admin.register(InvoiceLine)
class InvoiceLineAdmin(ReadOnlyAdmin):
    list_display = ["__str__"]


@admin.register(ReservationRequest)
class ReservationRequestAdmin(ReadOnlyAdmin):
    """Decided on the operators' requests page (/ops/requests/), where approving creates the plan."""

    list_display = ["project", "gpu_model", "gpus", "term_months", "status", "created_at", "plan"]
    list_filter = ["status", "term_months"]
    search_fields = ["project__slug", "requested_by__email"]


@admin.register(InvoiceSequence)
class InvoiceSequenceAdmin(ReadOnlyAdmin):
    """The last invoice number given out per issuer (gapless; only a close advances it)."""

    list_display = ["issuer", "last"]


@admin.register(MonthClose)
class MonthCloseAdmin(ReadOnlyAdmin):
    """Month closes started from the finance page or `close_month`, with their progress."""

    list_display = ["period_start", "status", "done", "failed", "total", "started_at"]
    list_filter = ["status"]


class StoragePriceForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = StoragePrice
        fields = ["effective_from", "per_gib_month", "note"]

    def clean_effective_from(self) -> Any:
        value = self.cleaned_data["effective_from"]
        if value is not None and value < pricing.floor_second(timezone.now()):
            raise forms.ValidationError(
                "A price change cannot take effect in the past; choose a time from now on."
            )
        return value


@admin.register(StoragePrice)
class StoragePriceAdmin(AuditedAdmin):
    """The storage price per GB-month; publish a new one with a later start (never edit one
    that metering has used)."""

    list_display = ("effective_from", "per_gib_month", "note", "created_at")
    form = StoragePriceForm
    readonly_fields = ["created_at"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # a version already in effect has priced storage: publish a new one instead
        if obj is not None and obj.effective_from <= timezone.now():
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.effective_from <= timezone.now():
            return False
        return super().has_delete_permission(request, obj)

    def save_model(self, request: HttpRequest, obj: Model, form: ModelForm, change: bool) -> None:  # type: ignore[type-arg]
        assert isinstance(obj, StoragePrice)
        if obj.effective_from < pricing.floor_second(timezone.now()):
            from django.core.exceptions import ValidationError

            raise ValidationError("A price change cannot take effect in the past.")
        super().save_model(request, obj, form, change)


@admin.register(StorageUsageRecord)
class StorageUsageRecordAdmin(ReadOnlyAdmin):
    list_display = ("volume", "project", "slice_start", "size_gib", "rate", "amount", "invoice")
    list_filter = ("period_start",)
