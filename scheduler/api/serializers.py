from __future__ import annotations

from rest_framework import serializers

from scheduler.models import GpuModel


class GpuModelSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
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
