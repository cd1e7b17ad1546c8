"""The job form: the same JobSpec the API builds, with errors shown next to the fields."""

from __future__ import annotations

from typing import Any

from django import forms

from portal.errors import DomainError
from portal.models import Project
from scheduler.admission import JobSpec, spec_validate
from scheduler.dependencies import dependencies_parse
from scheduler.job_request import Surface, carried_on, form_bounds
from scheduler.job_volumes import volume_mount_parse
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


def _volume_lines(text: str) -> tuple[dict[str, Any], ...]:
    """name:/path[:ro] lines as the request's volumes (blank lines skipped)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append(volume_mount_parse(line))
            except DomainError as exc:
                raise forms.ValidationError(f"Line {n}: {exc.message}") from exc
    return tuple(out)


# The fields the shape (whole GPUs, a fraction, a gang) decides, and those asked in hours.
SHAPED = (
    "gpus",
    "gpu_milli",
    "gpu_memory_mib",
    "nodes",
    "gpus_per_node",
    "elastic_min",
    "elastic_max",
)
IN_HOURS = {"runtime_estimate_s": "runtime_estimate_h", "time_limit_s": "time_limit_h"}
# Blank in the form, where the declared default is not the spec's
FORM_DEFAULTS: dict[str, Any] = {"name": "", "command": "", "priority": PriorityClass.NORMAL}


def _plain_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The spec's fields the form carries as they are (`scheduler.job_request`); a blank one
    takes the declared default."""
    out: dict[str, Any] = {}
    for f in carried_on(Surface.FORM):
        if f.name in SHAPED or f.name in IN_HOURS:
            continue
        value = data.get(f.name)
        if value in (None, ""):
            value = FORM_DEFAULTS.get(f.name, f.default)
            value = {} if isinstance(value, dict) else value  # never a shared dict
        out[f.name] = tuple(value or ()) if f.kind in ("str_list", "volumes") else value
    return out


def _shape_fields(data: dict[str, Any], shape: str) -> dict[str, Any]:
    """The GPU fields the chosen shape keeps; the others take their defaults."""
    return {
        "gpus": (data.get("gpus") or 1) if shape == "whole" else 1,
        "gpu_milli": (data.get("gpu_milli") or 500) if shape == "fraction" else 1000,
        "gpu_memory_mib": (data.get("gpu_memory_mib") or 0) if shape == "fraction" else 0,
        "nodes": data.get("nodes") if shape == "gang" else None,
        "gpus_per_node": data.get("gpus_per_node") if shape == "gang" else None,
        "elastic_min": data.get("elastic_min") if shape == "whole" else None,
        "elastic_max": data.get("elastic_max") if shape == "whole" else None,
    }


def _hours_fields(data: dict[str, Any]) -> dict[str, Any]:
    """Hours in the form, seconds in the spec."""
    return {
        seconds: int(hours * 3600) if (hours := data.get(field)) else None
        for seconds, field in IN_HOURS.items()
    }


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
        **form_bounds("image"),
        label="Image",
        help_text="A curated image (listed) or any image from an allowed registry; blank: the "
        "node's default image.",
        widget=forms.TextInput(attrs={"list": "curated-images", "placeholder": "blank: default"}),
    )
    min_gpu_memory_gb = forms.IntegerField(
        **form_bounds("min_gpu_memory_gb"), label="Min GPU memory (GB)"
    )
    precisions = forms.MultipleChoiceField(
        choices=[(p, p) for p in PRECISIONS], required=False, widget=forms.CheckboxSelectMultiple
    )
    shape = forms.ChoiceField(
        choices=[("whole", "Whole GPUs"), ("fraction", "A fraction of one GPU"), ("gang", "Gang")],
        initial="whole",
        widget=forms.RadioSelect,
    )
    gpus = forms.IntegerField(**form_bounds("gpus"), initial=1, label="GPUs")
    gpu_milli = forms.IntegerField(
        **form_bounds("gpu_milli", max_value=999),  # a whole GPU is the "whole" shape
        label="Fraction (milli-GPU)",
        help_text="Milli-GPU, e.g. 250 = a quarter.",
    )
    gpu_memory_mib = forms.IntegerField(
        **form_bounds("gpu_memory_mib"), label="GPU memory limit (MiB)"
    )
    nodes = forms.IntegerField(**form_bounds("nodes"))
    gpus_per_node = forms.IntegerField(**form_bounds("gpus_per_node"), label="GPUs per node")
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
    volumes = forms.CharField(
        required=False,
        label="Volumes",
        help_text="The project's volumes, one per line: name:/path/in/container, :ro for "
        "read-only (default /data/<name>).",
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "data:/data/data:ro"}),
    )
    checkpoint = forms.CharField(
        **form_bounds("checkpoint"),
        label="Checkpoints",
        help_text="volume:path inside it, e.g. ckpt:runs/a; CHECKPOINT_DIR points there and a "
        "restarted job resumes from it.",
    )
    # no upper bound here: the spec's check says how elastic_min, gpus and elastic_max relate
    elastic_min = forms.IntegerField(**form_bounds("elastic_min", max_value=None))
    elastic_max = forms.IntegerField(**form_bounds("elastic_max", max_value=None))
    shard_count = forms.IntegerField(**form_bounds("shard_count"), initial=1)
    max_restarts = forms.IntegerField(**form_bounds("max_restarts"), initial=0)
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
    cpu_milli = forms.IntegerField(**form_bounds("cpu_milli"), widget=forms.HiddenInput)
    memory_mib = forms.IntegerField(**form_bounds("memory_mib"), widget=forms.HiddenInput)
    working_dir = forms.CharField(
        **form_bounds("working_dir"),
        label="Working directory",
        help_text="In the container: /workspace (default) or a path in one of its volumes.",
    )

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

    def clean_volumes(self) -> tuple[dict[str, Any], ...]:
        return _volume_lines(self.cleaned_data.get("volumes") or "")

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
        spec = JobSpec(
            **_plain_fields(data),
            **_shape_fields(data, shape),
            **_hours_fields(data),
            source=Job.Source.FORM,
        )
        if shape == "gang" and not (spec.nodes and spec.gpus_per_node):
            self.add_error("nodes", "A gang needs a node count and GPUs per node.")
            return data
        try:
            self.spec = spec_validate(spec)
        except DomainError as exc:
            field = IN_HOURS.get(exc.field or "", exc.field)
            self.add_error(field if field in self.fields else None, exc.message)
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
