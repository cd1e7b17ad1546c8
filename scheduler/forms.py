"""The job form: the same JobSpec the API builds, with errors shown next to the fields."""

from __future__ import annotations

from typing import Any

from django import forms

from portal.errors import DomainError
from portal.models import Project
from scheduler.admission import JobSpec, spec_validate
from scheduler.dependencies import dependencies_parse
from scheduler.models import PRECISIONS, GpuModel, Job, Pool, PriorityClass


def _env_lines(text: str) -> dict[str, str]:
    """KEY=value lines as a dict (blank lines skipped)."""
    env = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if "=" not in line:
            raise forms.ValidationError(f"Line {n}: write KEY=value.")
        key, value = line.split("=", 1)
        env[key.strip()] = value
    return env


class WriteOnlyTextarea(forms.Textarea):
    """A textarea that never renders its value: a form shown again with errors does not echo
    the secrets typed into it (as PasswordInput does with render_value=False)."""

    def format_value(self, value: Any) -> str | None:
        return None


class JobForm(forms.Form):
    project = forms.ModelChoiceField(queryset=Project.objects.none(), to_field_name="slug")
    name = forms.CharField(max_length=100)
    command = forms.CharField(
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "python train.py --epochs 10"}),
    )
    gpu_model = forms.ModelChoiceField(
        queryset=GpuModel.objects.filter(is_active=True),
        to_field_name="name",
        required=False,
        empty_label="Any GPU that meets the constraints",
    )
    pool = forms.ModelChoiceField(
        queryset=Pool.objects.all(),
        to_field_name="name",
        required=False,
        empty_label="Any pool of our nodes",
        help_text="A Slurm-backed pool hands the job to its Slurm cluster.",
    )
    image = forms.CharField(
        max_length=300,
        required=False,
        label="Image",
        help_text="A curated image (listed) or any image from an allowed registry; blank: the "
        "node's default image.",
        widget=forms.TextInput(attrs={"list": "curated-images", "placeholder": "blank: default"}),
    )
    min_gpu_memory_gb = forms.IntegerField(
        min_value=0, max_value=1000, required=False, label="Min GPU memory (GB)"
    )
    precisions = forms.MultipleChoiceField(
        choices=[(p, p) for p in PRECISIONS], required=False, widget=forms.CheckboxSelectMultiple
    )
    shape = forms.ChoiceField(
        choices=[("whole", "Whole GPUs"), ("fraction", "A fraction of one GPU"), ("gang", "Gang")],
        initial="whole",
        widget=forms.RadioSelect,
    )
    gpus = forms.IntegerField(min_value=1, max_value=4096, initial=1, required=False, label="GPUs")
    gpu_milli = forms.IntegerField(
        min_value=1,
        max_value=999,
        required=False,
        label="Fraction (milli-GPU)",
        help_text="Milli-GPU, e.g. 250 = a quarter.",
    )
    gpu_memory_mib = forms.IntegerField(
        min_value=0, max_value=4 * 1024 * 1024, required=False, label="GPU memory limit (MiB)"
    )
    nodes = forms.IntegerField(min_value=1, max_value=512, required=False)
    gpus_per_node = forms.IntegerField(
        min_value=1, max_value=16, required=False, label="GPUs per node"
    )
    priority = forms.TypedChoiceField(
        choices=PriorityClass.choices, coerce=int, initial=PriorityClass.NORMAL
    )
    preemptible = forms.BooleanField(
        required=False, help_text="Cheaper; may be paused and resumed."
    )
    runtime_estimate_h = forms.DecimalField(
        min_value=0,
        max_value=2160,
        decimal_places=2,
        required=False,
        label="Runtime estimate (hours)",
    )
    time_limit_h = forms.DecimalField(
        min_value=0,
        max_value=2160,
        decimal_places=2,
        required=False,
        label="Time limit (hours)",
        help_text="The job is stopped when it runs longer.",
    )
    checkpoint_dir = forms.CharField(max_length=500, required=False, label="Checkpoint directory")
    elastic_min = forms.IntegerField(min_value=1, required=False)
    elastic_max = forms.IntegerField(min_value=1, required=False)
    shard_count = forms.IntegerField(min_value=1, max_value=1000, initial=1, required=False)
    max_restarts = forms.IntegerField(min_value=0, max_value=10, initial=0, required=False)
    dependencies = forms.CharField(
        max_length=2000,
        required=False,
        label="Start after",
        help_text="Slurm's syntax: after_ok:12 (once job 12 succeeded), after_any:12:13 (once "
        "both ended); an array's id means all its shards.",
        widget=forms.TextInput(attrs={"placeholder": "after_ok:12"}),
    )
    env = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "KEY=value, one per line"}),
        label="Environment",
    )
    # Kept from a cloned job or template (the API sets them; the form carries them along).
    cpu_milli = forms.IntegerField(
        min_value=0, max_value=4_096_000, required=False, widget=forms.HiddenInput
    )
    memory_mib = forms.IntegerField(
        min_value=0, max_value=64 * 1024 * 1024, required=False, widget=forms.HiddenInput
    )
    working_dir = forms.CharField(max_length=500, required=False, widget=forms.HiddenInput)

    secret_env = forms.CharField(
        required=False,
        widget=WriteOnlyTextarea(attrs={"rows": 2, "placeholder": "KEY=value, one per line"}),
        label="Secret environment",
        help_text="Write-only: never shown again (to you, your team or operators); sent only to "
        "the node that runs the job.",
    )

    def __init__(self, *args: Any, projects: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if projects is not None:
            self.fields["project"].queryset = projects  # type: ignore[attr-defined]
        self.spec: JobSpec | None = None

    def clean_env(self) -> dict[str, str]:
        return _env_lines(self.cleaned_data.get("env") or "")

    def clean_secret_env(self) -> dict[str, str]:
        return _env_lines(self.cleaned_data.get("secret_env") or "")

    def clean_dependencies(self) -> tuple[tuple[str, int], ...]:
        try:
            return dependencies_parse(self.cleaned_data.get("dependencies") or "")
        except DomainError as exc:
            raise forms.ValidationError(exc.message) from exc

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        shape = data.get("shape") or "whole"
        runtime_h = data.get("runtime_estimate_h")
        limit_h = data.get("time_limit_h")
        spec = JobSpec(
            name=data.get("name", ""),
            command=data.get("command", ""),
            cpu_milli=data.get("cpu_milli") or 0,
            memory_mib=data.get("memory_mib") or 0,
            working_dir=data.get("working_dir") or "",
            gpu_model=data.get("gpu_model"),
            min_gpu_memory_gb=data.get("min_gpu_memory_gb") or 0,
            precisions=tuple(data.get("precisions") or ()),
            gpus=(data.get("gpus") or 1) if shape == "whole" else 1,
            gpu_milli=(data.get("gpu_milli") or 500) if shape == "fraction" else 1000,
            gpu_memory_mib=(data.get("gpu_memory_mib") or 0) if shape == "fraction" else 0,
            nodes=data.get("nodes") if shape == "gang" else None,
            gpus_per_node=data.get("gpus_per_node") if shape == "gang" else None,
            priority=data.get("priority", PriorityClass.NORMAL),
            preemptible=bool(data.get("preemptible")),
            runtime_estimate_s=int(runtime_h * 3600) if runtime_h else None,
            time_limit_s=int(limit_h * 3600) if limit_h else None,
            checkpoint_dir=data.get("checkpoint_dir") or "",
            elastic_min=data.get("elastic_min") if shape == "whole" else None,
            elastic_max=data.get("elastic_max") if shape == "whole" else None,
            shard_count=data.get("shard_count") or 1,
            max_restarts=data.get("max_restarts") or 0,
            dependencies=data.get("dependencies") or (),
            image=(data.get("image") or "").strip(),
            env=data.get("env") or {},
            secret_env=data.get("secret_env") or {},
            source=Job.Source.FORM,
            pool=data.get("pool"),
        )
        if shape == "gang" and not (spec.nodes and spec.gpus_per_node):
            self.add_error("nodes", "A gang needs a node count and GPUs per node.")
            return data
        try:
            self.spec = spec_validate(spec)
        except DomainError as exc:
            field = exc.field if exc.field in self.fields else None
            if exc.field == "runtime_estimate_s":
                field = "runtime_estimate_h"
            if exc.field == "time_limit_s":
                field = "time_limit_h"
            self.add_error(field, exc.message)
        return data


class TemplateForm(forms.Form):
    name = forms.CharField(max_length=100, label="Template name")


class QuotaRequestForm(forms.Form):
    max_gpus = forms.IntegerField(
        min_value=1, max_value=100_000, required=False, label="Concurrent GPUs"
    )
    gpu_hours_per_month = forms.IntegerField(
        min_value=1, max_value=10_000_000, required=False, label="GPU-hours per month"
    )
    gpu_model = forms.ModelChoiceField(
        queryset=GpuModel.objects.filter(is_active=True),
        to_field_name="name",
        required=False,
        empty_label="(no per-model change)",
        label="GPU model",
    )
    model_max_gpus = forms.IntegerField(
        min_value=1, max_value=100_000, required=False, label="GPUs of that model"
    )
    justification = forms.CharField(
        max_length=2000, widget=forms.Textarea(attrs={"rows": 3}), label="What it is for"
    )


class OwnerLimitsForm(forms.Form):
    max_gpus_per_member = forms.IntegerField(
        min_value=1,
        max_value=100_000,
        required=False,
        label="Concurrent GPUs per member",
        help_text="Blank: no cap beyond the project's.",
    )


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("decline", "Decline")])
    reason = forms.CharField(max_length=2000, required=False)
