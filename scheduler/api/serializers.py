from __future__ import annotations

from typing import Any

from rest_framework import serializers

from portal.api.serializers import ProjectSerializer
from portal.models import Project
from scheduler.estimates import rates_now
from scheduler.models import GpuModel, Quota, QuotaModelLimit


class ChargedRateField(serializers.DecimalField):
    """A model's price per GPU-hour as billing charges it now (the price list, on demand),
    not the catalog's list price. The list view reads every rate at once (`rates` in the
    serializer's context)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_digits=8, decimal_places=4, read_only=True, source="*", **kwargs)

    def to_representation(self, value: Any) -> Any:
        rates = self.context.get("rates") or {}
        rate = rates.get(value.pk)
        if rate is None:
            rate = rates_now([value])[value.pk]
        return super().to_representation(rate)


class GpuModelSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    price_per_gpu_hour = ChargedRateField(
        help_text="USD per GPU-hour on demand, as billing charges it now (the price list)."
    )
    fleet_gpus = serializers.IntegerField(read_only=True, help_text="Healthy GPUs on ready nodes.")

    class Meta:
        model = GpuModel
        fields = [
            "name",
            "display_name",
            "vendor",
            "architecture",
            "compute_capability",
            "memory_gb",
            "memory_bandwidth_gbs",
            "precisions",
            "tflops_fp16_bf16",
            "tflops_fp32",
            "tflops_fp8",
            "mig_profiles",
            "tdp_watts",
            "price_per_gpu_hour",
            "fleet_gpus",
        ]


class QuotaModelLimitSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    gpu_model: serializers.SlugRelatedField = serializers.SlugRelatedField(  # type: ignore[type-arg]
        slug_field="name", read_only=True
    )

    class Meta:
        model = QuotaModelLimit
        fields = ["gpu_model", "max_gpus"]


class QuotaSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
    per_model = QuotaModelLimitSerializer(source="model_limits", many=True, read_only=True)
    max_priority = serializers.CharField(source="get_max_priority_display", read_only=True)

    class Meta:
        model = Quota
        fields = [
            "max_gpus",
            "per_model",
            "gpu_hours_per_month",
            "max_gpus_per_job",
            "max_priority",
            "allow_borrowing",
        ]


class ProjectDetailSerializer(ProjectSerializer):
    quota = QuotaSerializer(read_only=True)
    role = serializers.SerializerMethodField()

    class Meta(ProjectSerializer.Meta):
        fields = [*ProjectSerializer.Meta.fields, "quota", "role"]

    def get_role(self, obj: Project) -> str | None:
        role: str | None = self.context.get("role")
        return role
