"""Billing API shapes. Money is serialized as decimal strings, never floats."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from billing.models import Budget, Invoice, InvoiceLine, PriceVersion, StoragePrice
from portal.api.serializers import StrictSerializer


class BudgetWriteSerializer(StrictSerializer):
    monthly_amount = serializers.DecimalField(
        max_digits=12, decimal_places=2, min_value=Decimal("0.01"), max_value=Decimal("9999999999")
    )
    hard_cap = serializers.BooleanField(default=False)
    preemptible_allowance_percent = serializers.IntegerField(min_value=0, max_value=100, default=10)


class BudgetSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    class Meta:
        model = Budget
        fields = ["monthly_amount", "hard_cap", "preemptible_allowance_percent", "updated_at"]


class ModelRowSerializer(serializers.Serializer):  # type: ignore[type-arg]
    model = serializers.CharField()
    tier = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=16, decimal_places=4)
    covered_hours = serializers.DecimalField(max_digits=16, decimal_places=4)
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)
    credited = serializers.DecimalField(max_digits=14, decimal_places=2)


class JobRowSerializer(serializers.Serializer):  # type: ignore[type-arg]
    job_id = serializers.IntegerField()
    name = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=16, decimal_places=4)
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)


class DayRowSerializer(serializers.Serializer):  # type: ignore[type-arg]
    day = serializers.DateField()
    gpu_hours = serializers.DecimalField(max_digits=16, decimal_places=4)
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)


class VolumeRowSerializer(serializers.Serializer):  # type: ignore[type-arg]
    volume = serializers.CharField()
    kind = serializers.CharField(help_text="scratch, node_local, shared or dataset")
    size_gib = serializers.IntegerField()
    gb_months = serializers.DecimalField(max_digits=16, decimal_places=4)
    amount = serializers.DecimalField(max_digits=14, decimal_places=2)


class UsageSummarySerializer(serializers.Serializer):  # type: ignore[type-arg]
    month = serializers.DateField(source="period_start")
    metered = serializers.DecimalField(max_digits=14, decimal_places=2)
    open_estimate = serializers.DecimalField(
        max_digits=14, decimal_places=2, help_text="Used, not yet metered (current price)."
    )
    to_date = serializers.DecimalField(max_digits=14, decimal_places=2)
    credited = serializers.DecimalField(max_digits=14, decimal_places=2)
    burn_per_hour = serializers.DecimalField(max_digits=14, decimal_places=2)
    forecast = serializers.DecimalField(max_digits=14, decimal_places=2, allow_null=True)
    budget = BudgetSerializer(allow_null=True)
    by_model = ModelRowSerializer(many=True)
    by_job = JobRowSerializer(many=True)
    by_day = DayRowSerializer(many=True)
    storage = serializers.DecimalField(
        max_digits=14, decimal_places=2, help_text="Storage metered this month (in `metered`)."
    )
    by_volume = VolumeRowSerializer(
        many=True, help_text="Storage by volume: GB-months of its size limit."
    )


class InvoiceLineSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    gpu_model = serializers.SlugRelatedField(slug_field="name", read_only=True)  # type: ignore[var-annotated]

    class Meta:
        model = InvoiceLine
        fields = [
            "id",
            "position",
            "kind",
            "description",
            "gpu_model",
            "tier",
            "gpu_hours",
            "unit_price",
            "amount",
            "record_count",
        ]


class InvoiceSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    account = serializers.CharField(source="account.name", read_only=True)

    class Meta:
        model = Invoice
        fields = [
            "id",
            "number",
            "account",
            "period_start",
            "period_end",
            "status",
            "currency",
            "subtotal",
            "credits_applied",
            "tax_rate",
            "tax",
            "total",
            "issued_at",
            "paid_at",
        ]


class InvoiceDetailSerializer(InvoiceSerializer):
    lines = InvoiceLineSerializer(many=True, read_only=True)

    class Meta(InvoiceSerializer.Meta):
        fields = [*InvoiceSerializer.Meta.fields, "lines"]


class JobCostSerializer(serializers.Serializer):  # type: ignore[type-arg]
    job_id = serializers.IntegerField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=2)
    currency = serializers.CharField()


class StoragePriceSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    """A storage price version: USD per GB-month (a GiB of size limit held 730 hours)."""

    class Meta:
        model = StoragePrice
        fields = ["effective_from", "per_gib_month", "note"]


class PriceSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    gpu_model = serializers.SlugRelatedField(slug_field="name", read_only=True)  # type: ignore[var-annotated]
    preemptible_per_gpu_hour = serializers.SerializerMethodField()

    class Meta:
        model = PriceVersion
        fields = [
            "gpu_model",
            "effective_from",
            "on_demand_per_gpu_hour",
            "preemptible_per_gpu_hour",
            "preemptible_discount",
            "reserved_discount_1m",
            "reserved_discount_12m",
            "reserved_discount_36m",
        ]

    def get_preemptible_per_gpu_hour(self, obj: PriceVersion) -> str:
        return str(obj.rate(preemptible=True))
