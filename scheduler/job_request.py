"""The job request, declared once: every field, its bounds, and where each surface carries it.

A job request reaches the portal through the API, the job form, a Kubernetes manifest or the
CLI; it becomes a `JobSpec`, a `Job` row, a Slurm batch script or an agent's assignment, and a
template keeps it to submit again. `FIELDS` says, for each field and each of those surfaces
(`Surface`), under which name the surface carries it, or `Absent("why not")`.

Derived from it: the API serializer's bounds and defaults (`api_bounds`), the form's bounds
(`form_bounds`) and the spec it builds from its plain fields, `job_from_spec` (the Job row of a
spec), the manifest's annotations and the manifest path each validation error points at, the
exporter's number annotations, and a template's request body. The other surfaces are written by
hand and checked against it by `tests/unit/test_job_request.py`: the CLI's flag table (a
separate package that cannot import the server), `JobSpec` (a typed dataclass), the model (its
migrations), the job answer's field order, the Slurm batch script and the agent's assignment.

How to add a field (as `volumes` and `checkpoint` were):
1. One `RequestField(...)` entry below. Python refuses it until every surface is answered:
   carried (the name there: a serializer field, a form field, a manifest path with `{container}`
   for the container's path, a CLI flag, a Slurm option, an assignment key) or `Absent(reason)`.
2. Where a surface needs more than a copy (a list of volumes becomes a manifest's `volumes` and
   `volumeMounts`, an assignment's mounts), one small named mapper in that surface's module,
   named in the entry's `mappers` so the next reader finds it.
   Where they go: a DRF field in `JobCreateSerializer` (`api_bounds` covers int, str and bool;
   a list of objects needs its nested serializer), a `BODY_MAPPERS` entry in
   `job_templates` for a new kind, a step in `manifests.parse.manifest_read` that sets
   `r.values[name]` (and the keys it honours in `POD_KEYS`/`CONTAINER_KEYS`), a line in
   `manifests.export`, the column on `Job` (a migration) and on `JobSpec`.
3. Give the field a non-default value in the test's `_job()` and run
   `tests/unit/test_job_request.py`: it names each surface that does not yet match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

MAX_GPUS_PER_JOB = 4096
MAX_SHARDS = 1000
MAX_PATH = 500
ANNOTATION = "gpucloud.example/"  # the portal's manifest annotations: what a Job has no field for


class Surface(StrEnum):
    """Where a job request is read, written or stored."""

    API_IN = "api_in"  # JobCreateSerializer: POST /api/v1/jobs and the dry run
    API_OUT = "api_out"  # JobSerializer / JobDetailSerializer: the job's answer
    FORM = "form"  # scheduler.forms.JobForm
    MANIFEST_IN = "manifest_in"  # scheduler.manifests.parse: the path read
    MANIFEST_OUT = "manifest_out"  # scheduler.manifests.export: the path written
    CLI = "cli"  # cli/gpucloud_cli JOB_FLAGS: the flag
    SPEC = "spec"  # scheduler.admission.JobSpec
    MODEL = "model"  # scheduler.models.Job
    SLURM = "slurm"  # scheduler.backends.slurm.submit: the sbatch option or script part
    ASSIGNMENT = "assignment"  # scheduler.nodes.assignments: the agent's wire key
    TEMPLATE = "template"  # scheduler.job_templates.job_request_body: the body key


@dataclass(frozen=True)
class Absent:
    """A surface does not carry the field, and why."""

    reason: str


Carry = str | Absent


@dataclass(frozen=True)
class RequestField:
    """One field of a job request. Every surface is a required keyword: carried or Absent."""

    name: str
    kind: str  # int, str, bool, str_list, str_map, gpu_model, pool, priority, dependencies,
    # volumes
    help: str
    api_in: Carry
    api_out: Carry
    form: Carry
    manifest_in: Carry
    manifest_out: Carry
    cli: Carry
    model: Carry
    slurm: Carry
    assignment: Carry
    template: Carry
    default: Any = None
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None
    nullable: bool = False  # None means "not asked" (no default)
    manifest_errors_at: str = ""  # where a validation error points, when not the path read
    mappers: tuple[str, ...] = field(default=())  # the named mappers of surfaces that map it

    @property
    def spec(self) -> Carry:
        return self.name  # JobSpec carries every field under its own name

    def on(self, surface: Surface) -> Carry:
        return getattr(self, str(surface))  # type: ignore[no-any-return]

    def carried_on(self, surface: Surface) -> str | None:
        carry = self.on(surface)
        return None if isinstance(carry, Absent) else carry


# Reasons written once, used by several fields.
PLACEMENT = Absent("used to place the job; the agent is given the GPUs' UUIDs")
PORTAL_DECIDES = Absent("the portal acts on it (queue, preemption, requeue); the agent gets 'stop'")
MANIFEST_ONLY = Absent("comes from a manifest only (no single field in this surface)")
NOT_ANSWERED = Absent("not in the job's API answer today; the template API's body carries it")
SLURM_NO_FRACTION = Absent("Slurm pools take whole GPUs: a share is refused before sbatch")
SLURM_PARTITION = Absent("the operator's partitions decide which GPUs a Slurm job gets")
NO_CLI = Absent("no CLI flag yet: give a manifest with -f")
C = "{container}"  # the container's path in a manifest
A = ANNOTATION


def annotation(key: str) -> str:
    return f"metadata.annotations.{ANNOTATION}{key}"


FIELDS: tuple[RequestField, ...] = (
    RequestField(
        name="name", kind="str", help="job name", max_length=100,
        api_in="name", api_out="name", form="name",
        manifest_in="metadata.name", manifest_out=annotation("name"), cli="--name",
        model="name", slurm="--job-name", assignment=Absent("the agent knows jobs by id"),
        template="name", mappers=("export._k8s_name",),
    ),
    RequestField(
        name="command", kind="str", help="command line (or give it after --)", max_length=10_000,
        api_in="command", api_out="command", form="command",
        manifest_in=f"{C}.command", manifest_out=f"{C}.command", cli="--command",
        model="command", slurm="the script's last line", assignment="command", template="command",
    ),
    RequestField(
        name="image", kind="str", help="container image", default="", max_length=300,
        api_in="image", api_out="image", form="image",
        manifest_in=f"{C}.image", manifest_out=f"{C}.image", cli="--image", model="image",
        slurm=Absent("a Slurm cluster runs the command with its own software"),
        assignment="image", template="image",
    ),
    RequestField(
        name="gpus", kind="int", help="GPUs (whole devices, per node for gang jobs)",
        default=1, minimum=1, maximum=MAX_GPUS_PER_JOB,
        api_in="gpus", api_out="gpus", form="gpus",
        manifest_in=f"{C}.resources.limits.nvidia.com/gpu",
        manifest_out=f"{C}.resources.limits.nvidia.com/gpu", cli="--gpus", model="gpus",
        slurm="--gres", assignment="gpu_uuids", template="gpus",
        mappers=("forms._shape_fields", "slurm.batch_job"),
    ),
    RequestField(
        name="gpu_milli", kind="int", help="a fraction of one GPU, in 1/1000",
        default=1000, minimum=1, maximum=1000,
        api_in="gpu_milli", api_out="gpu_milli", form="gpu_milli",
        manifest_in=annotation("gpu-milli"), manifest_out=annotation("gpu-milli"),
        cli="--gpu-milli", model="gpu_milli", slurm=SLURM_NO_FRACTION,
        assignment="share_milli", template="gpu_milli", mappers=("forms._shape_fields",),
    ),
    RequestField(
        name="gpu_memory_mib", kind="int", help="GPU memory for a fraction",
        default=0, minimum=0, maximum=4 * 1024 * 1024,
        api_in="gpu_memory_mib", api_out="gpu_memory_mib", form="gpu_memory_mib",
        manifest_in=annotation("gpu-memory-mib"), manifest_out=annotation("gpu-memory-mib"),
        cli="--gpu-memory-mib", model="gpu_memory_mib", slurm=SLURM_NO_FRACTION,
        assignment="gpu_memory_limit_mib", template="gpu_memory_mib",
    ),
    RequestField(
        name="gpu_model", kind="gpu_model", help="GPU model name (see the catalog)",
        nullable=True,
        api_in="gpu_model", api_out="gpu_model", form="gpu_model",
        manifest_in=f"{C}.resources.limits.nvidia.com/gpu.model",
        manifest_out="spec.template.spec.affinity", cli="--gpu-model", model="gpu_model",
        slurm="--gres", assignment=PLACEMENT, template="gpu_model",
        mappers=("parse._gpu_models", "export._affinity", "slurm.gres_type"),
    ),
    RequestField(
        name="gpu_models", kind="str_list", help="any of these catalog GPU models",
        default=(),
        api_in=Absent("the API names one model; a list comes from a manifest's node affinity"),
        api_out="gpu_models", form=MANIFEST_ONLY,
        manifest_in="spec.template.spec.affinity", manifest_out="spec.template.spec.affinity",
        manifest_errors_at=f"{C}.resources.limits.nvidia.com/gpu.model",
        cli=NO_CLI, model="gpu_models",
        slurm=Absent("Slurm's --gres names one type: a list runs on any GPU of the partition"),
        assignment=PLACEMENT,
        template=Absent("the submit API does not take it (a manifest's affinity does)"),
        mappers=("parse._gpu_models", "export._affinity"),
    ),
    RequestField(
        name="min_gpu_memory_gb", kind="int", help="least memory of each GPU",
        default=0, minimum=0, maximum=1000,
        api_in="min_gpu_memory_gb", api_out="min_gpu_memory_gb", form="min_gpu_memory_gb",
        manifest_in=annotation("min-gpu-memory-gb"), manifest_out=annotation("min-gpu-memory-gb"),
        manifest_errors_at=f"{C}.resources.limits.nvidia.com/gpu.model",
        cli="--min-gpu-memory-gb", model="min_gpu_memory_gb", slurm=SLURM_PARTITION,
        assignment=PLACEMENT, template="min_gpu_memory_gb",
    ),
    RequestField(
        name="precisions", kind="str_list", help="needed precision (repeat)", default=(),
        api_in="precisions", api_out="precisions", form="precisions",
        manifest_in=annotation("precisions"), manifest_out=annotation("precisions"),
        cli="--precision", model="precisions", slurm=SLURM_PARTITION, assignment=PLACEMENT,
        template="precisions",
    ),
    RequestField(
        name="nodes", kind="int", help="nodes for a gang job", minimum=1, maximum=512,
        nullable=True,
        api_in="nodes", api_out="nodes", form="nodes",
        manifest_in=annotation("nodes"), manifest_out=annotation("nodes"), cli="--nodes",
        model="nodes", slurm="--nodes", assignment="gpu_uuids", template="nodes",
        mappers=("forms._shape_fields",),
    ),
    RequestField(
        name="gpus_per_node", kind="int", help="GPUs on each node of a gang", minimum=1,
        maximum=16, nullable=True,
        api_in="gpus_per_node", api_out="gpus_per_node", form="gpus_per_node",
        manifest_in=f"{C}.resources.limits.nvidia.com/gpu",
        manifest_out=f"{C}.resources.limits.nvidia.com/gpu", cli="--gpus-per-node",
        model="gpus_per_node", slurm="--gres", assignment="gpu_uuids", template="gpus_per_node",
        manifest_errors_at=annotation("nodes"), mappers=("forms._shape_fields",),
    ),
    RequestField(
        name="cpu_milli", kind="int", help="CPU in 1/1000 of a core", default=0, minimum=0,
        maximum=4_096_000,
        api_in="cpu_milli", api_out="cpu_milli", form="cpu_milli",
        manifest_in=f"{C}.resources.limits.cpu", manifest_out=f"{C}.resources.limits.cpu",
        manifest_errors_at=f"{C}.resources", cli="--cpu-milli", model="cpu_milli",
        slurm="--cpus-per-gpu", assignment="cpu_milli", template="cpu_milli",
    ),
    RequestField(
        name="memory_mib", kind="int", help="memory in MiB", default=0, minimum=0,
        maximum=64 * 1024 * 1024,
        api_in="memory_mib", api_out="memory_mib", form="memory_mib",
        manifest_in=f"{C}.resources.limits.memory", manifest_out=f"{C}.resources.limits.memory",
        manifest_errors_at=f"{C}.resources", cli="--memory-mib", model="memory_mib",
        slurm="--mem-per-gpu", assignment="memory_mib", template="memory_mib",
    ),
    RequestField(
        name="shm_mib", kind="int", help="shared memory in MiB", default=0, minimum=0,
        maximum=1024 * 1024,
        api_in=Absent("shared memory comes from a manifest's memory emptyDir at /dev/shm"),
        api_out="shm_mib", form=MANIFEST_ONLY,
        manifest_in="spec.template.spec.volumes", manifest_out="spec.template.spec.volumes",
        cli=NO_CLI, model="shm_mib",
        slurm=Absent("a Slurm node's /dev/shm is the cluster's own"), assignment="shm_mib",
        template=Absent("the submit API does not take it (a manifest's emptyDir does)"),
        mappers=("parse._volume_mounts", "export.job_manifest"),
    ),
    RequestField(
        name="priority", kind="priority", help="low, normal, high or urgent (up to your quota's)",
        default="normal",
        api_in="priority", api_out="priority", form="priority",
        manifest_in=annotation("priority"), manifest_out=annotation("priority"),
        cli="--priority", model="priority", slurm="--qos", assignment=PORTAL_DECIDES,
        template="priority", mappers=("slurm.qos_for",),
    ),
    RequestField(
        name="preemptible", kind="bool", help="cheaper; may be paused and resumed",
        default=False,
        api_in="preemptible", api_out="preemptible", form="preemptible",
        manifest_in=annotation("preemptible"), manifest_out=annotation("preemptible"),
        cli="--preemptible", model="preemptible", slurm="--qos", assignment=PORTAL_DECIDES,
        template="preemptible", mappers=("slurm.qos_for",),
    ),
    RequestField(
        name="runtime_estimate_s", kind="int", help="expected run time: seconds, or 90m, 2h",
        minimum=1, maximum=90 * 86400, nullable=True,
        api_in="runtime_estimate_s", api_out="runtime_estimate_s", form="runtime_estimate_h",
        manifest_in=annotation("runtime-estimate-seconds"),
        manifest_out=annotation("runtime-estimate-seconds"), cli="--runtime-estimate",
        model="runtime_estimate_s", slurm=Absent("the portal plans with it; --time is the limit"),
        assignment=Absent("the portal plans with it"), template="runtime_estimate_s",
        mappers=("forms._hours_fields", "job_templates.form_initial",),
    ),
    RequestField(
        name="time_limit_s", kind="int",
        help="Wall-clock limit in seconds; past it the job is stopped with 'time limit'.",
        minimum=60, maximum=90 * 86400, nullable=True,
        api_in="time_limit_s", api_out="time_limit_s", form="time_limit_h",
        manifest_in="spec.activeDeadlineSeconds", manifest_out="spec.activeDeadlineSeconds",
        cli="--time-limit", model="time_limit_s", slurm="--time", assignment="time_limit_s",
        template="time_limit_s", mappers=("forms._hours_fields", "job_templates.form_initial",),
    ),
    RequestField(
        name="volumes", kind="volumes",
        help="the project's volumes to mount: name:/path/in/container[:ro] (repeat)",
        default=(),
        api_in="volumes", api_out="volumes", form="volumes",
        manifest_in="spec.template.spec.volumes", manifest_out="spec.template.spec.volumes",
        manifest_errors_at=f"{C}.volumeMounts",
        cli="--volume", model="volumes", slurm="VOLUME_<NAME> in the script",
        assignment="volumes", template="volumes",
        mappers=(
            "job_volumes.mounts_validate", "job_volumes.assignment_volumes",
            "parse._volume_mounts", "export._volumes", "slurm.volume_script",
        ),
    ),
    RequestField(
        name="checkpoint", kind="str",
        help="where checkpoints go: <volume>:<path inside it> (CHECKPOINT_DIR points there)",
        default="", max_length=600,
        api_in="checkpoint", api_out="checkpoint", form="checkpoint",
        manifest_in=annotation("checkpoint"), manifest_out=annotation("checkpoint"),
        cli="--checkpoint", model="checkpoint", slurm="CHECKPOINT_DIR in the script",
        assignment="checkpoint", template="checkpoint",
        mappers=("job_volumes.checkpoint_container_path",),
    ),
    RequestField(
        name="working_dir", kind="str",
        help="the working directory in the container (default /workspace)", default="",
        max_length=MAX_PATH,
        api_in="working_dir", api_out="working_dir", form="working_dir",
        manifest_in=f"{C}.workingDir", manifest_out=f"{C}.workingDir", cli="--working-dir",
        model="working_dir",
        slurm=Absent("a container path: a Slurm job runs in its own output directory"),
        assignment="working_dir", template="working_dir",
    ),
    RequestField(
        name="env", kind="str_map", help="environment variables", default={},
        api_in="env", api_out="env", form="env",
        manifest_in=f"{C}.env", manifest_out=f"{C}.env", cli="--env", model="env",
        slurm="exports in the script", assignment="env", template="env",
        mappers=("forms._env_lines",),
    ),
    RequestField(
        name="secret_env", kind="str_map",
        help="write-only: shown masked, sent only to the node that runs the job", default={},
        api_in="secret_env", api_out="secret_env", form="secret_env",
        manifest_in=Absent("a manifest is a file: it carries no write-only values"),
        manifest_out=f"{C}.env", cli="--secret-env", model="secret_env",
        slurm="exports in the script", assignment="env",
        template=Absent("write-only: never stored in a template"),
        mappers=("forms._env_lines",),
    ),
    RequestField(
        name="max_restarts", kind="int", help="restarts after a failure", default=0, minimum=0,
        maximum=10,
        api_in="max_restarts", api_out="max_restarts", form="max_restarts",
        manifest_in="spec.backoffLimit", manifest_out="spec.backoffLimit",
        cli="--max-restarts", model="max_restarts", slurm="--requeue",
        assignment=PORTAL_DECIDES, template="max_restarts",
    ),
    RequestField(
        name="elastic_min", kind="int", help="fewest GPUs an elastic job runs on", minimum=1,
        maximum=MAX_GPUS_PER_JOB, nullable=True,
        api_in="elastic_min", api_out="elastic_min", form="elastic_min",
        manifest_in=annotation("elastic-min"), manifest_out=annotation("elastic-min"),
        cli="--elastic-min", model="elastic_min", slurm=Absent("Slurm jobs do not resize"),
        assignment=PORTAL_DECIDES, template="elastic_min",
    ),
    RequestField(
        name="elastic_max", kind="int", help="most GPUs an elastic job runs on", minimum=1,
        maximum=MAX_GPUS_PER_JOB, nullable=True,
        api_in="elastic_max", api_out="elastic_max", form="elastic_max",
        manifest_in=annotation("elastic-max"), manifest_out=annotation("elastic-max"),
        manifest_errors_at=annotation("elastic-min"),
        cli="--elastic-max", model="elastic_max", slurm=Absent("Slurm jobs do not resize"),
        assignment=PORTAL_DECIDES, template="elastic_max",
    ),
    RequestField(
        name="shard_count", kind="int", help="array job: this many shards", default=1,
        minimum=1, maximum=MAX_SHARDS,
        api_in="shard_count", api_out="shard_count", form="shard_count",
        manifest_in="spec.completions", manifest_out="spec.completions", cli="--shard-count",
        model="shard_count", slurm="--array", assignment="env", template="shard_count",
        mappers=("admission.job_from_spec",),
    ),
    RequestField(
        name="dependencies", kind="dependencies",
        help="start after these jobs, as Slurm's -d (afterok, afterany)", default=(),
        api_in="dependencies", api_out="dependencies", form="dependencies",
        manifest_in=Absent("a Job manifest has no dependencies; the API and form take them"),
        manifest_out=Absent("a Job manifest has no dependencies"), cli="--dependency",
        model=Absent("not a column: JobDependency rows (Job.dependencies), one per job"),
        slurm="--dependency", assignment=PORTAL_DECIDES,
        template=Absent("a resubmission starts afresh: it waits for no earlier job"),
        mappers=("dependencies.dependencies_parse", "slurm.slurm_dependency"),
    ),
    RequestField(
        name="pool", kind="pool", help="a pool by name (e.g. a Slurm-backed one)", nullable=True,
        api_in="pool", api_out=NOT_ANSWERED, form="pool",
        manifest_in=Absent("a manifest's namespace names the project; the API or form picks a pool"),
        manifest_out=Absent("the export is for any cluster, not one of our pools"),
        cli=Absent("no CLI flag yet: the API takes it"), model="pool",
        slurm=Absent("the pool is the Slurm cluster itself"), assignment=PORTAL_DECIDES,
        template="pool",
    ),
)  # fmt: skip

BY_NAME: dict[str, RequestField] = {f.name: f for f in FIELDS}


def carried_on(surface: Surface) -> tuple[RequestField, ...]:
    """The fields a surface carries, in declaration order."""
    return tuple(f for f in FIELDS if f.carried_on(surface) is not None)


def annotation_key(path: Carry) -> str | None:
    """The annotation's full key a manifest path names (`gpucloud.example/nodes`), else None."""
    prefix = "metadata.annotations."
    if isinstance(path, str) and path.startswith(annotation("")):
        return path[len(prefix) :]
    return None


def manifest_annotations() -> tuple[str, ...]:
    """The portal's manifest annotation keys (after `ANNOTATION`) that fields are read from
    or written to."""
    prefix = annotation("")
    paths = [p for f in FIELDS for p in (f.manifest_in, f.manifest_out) if isinstance(p, str)]
    return tuple(dict.fromkeys(p[len(prefix) :] for p in paths if p.startswith(prefix)))


def manifest_number_annotations() -> tuple[RequestField, ...]:
    """The fields a manifest gives as a whole-number annotation."""
    prefix = annotation("")
    return tuple(
        f
        for f in FIELDS
        if f.kind == "int" and isinstance(f.manifest_in, str) and f.manifest_in.startswith(prefix)
    )


def manifest_error_path(field_name: str | None, container_path: str) -> str:
    """Where in a manifest the field a validation error names comes from."""
    f = BY_NAME.get(field_name or "")
    if f is None:
        return "manifest"
    path = f.manifest_errors_at or f.carried_on(Surface.MANIFEST_IN)
    if path is None:
        return "manifest"
    return path.replace(C, container_path)


def api_bounds(name: str) -> dict[str, Any]:
    """A DRF field's bounds and default for a declared field (`IntegerField`/`CharField`)."""
    f = BY_NAME[name]
    kwargs: dict[str, Any] = {}
    if f.minimum is not None:
        kwargs["min_value"] = f.minimum
    if f.maximum is not None:
        kwargs["max_value"] = f.maximum
    if f.max_length is not None:
        kwargs["max_length"] = f.max_length
    if f.nullable:
        kwargs |= {"required": False, "allow_null": True}
    elif f.default == "":
        kwargs |= {"required": False, "allow_blank": True, "default": ""}
    elif f.default is not None:
        kwargs["default"] = f.default
    return kwargs


def form_bounds(name: str, **overrides: Any) -> dict[str, Any]:
    """A Django form field's bounds for a declared field, `overrides` on top; every request
    field is optional in the form (a blank one takes the default)."""
    f = BY_NAME[name]
    kwargs: dict[str, Any] = {"required": False}
    if f.minimum is not None:
        kwargs["min_value"] = f.minimum
    if f.maximum is not None:
        kwargs["max_value"] = f.maximum
    if f.max_length is not None:
        kwargs["max_length"] = f.max_length
    return kwargs | overrides
