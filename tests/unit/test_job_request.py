"""The job request's one declaration against every surface that carries it (no database).

`gaps(fields)` asks each surface, for each declared field, whether it carries the field under
the declared name, and whether a field declared Absent really is absent. A field added to the
declaration that some surface neither carries nor declines (with a reason) fails here.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import pytest
from gpucloud_cli.main import JOB_FLAGS, _duration

from agent.protocol import Assignment
from portal.models import Project
from scheduler.admission import JobSpec
from scheduler.api.jobs import JobCreateSerializer, JobDetailSerializer
from scheduler.backends.slurm.models import SlurmPool
from scheduler.backends.slurm.submit import batch_job
from scheduler.forms import JobForm
from scheduler.job_request import (
    BY_NAME,
    FIELDS,
    Absent,
    RequestField,
    Surface,
    annotation_key,
    carried_on,
    manifest_error_path,
)
from scheduler.job_templates import job_request_body
from scheduler.manifests import job_manifest
from scheduler.manifests.parse import (
    CONTAINER,
    CONTAINER_KEYS,
    HONOURED,
    JOB_KEYS,
    KNOWN_ANNOTATIONS,
    POD,
    POD_KEYS,
    manifest_read,
)
from scheduler.models import Job, Pool

C = "{container}"
SPEC_EXTRAS = {"source", "manifest_ignored"}  # where a request came from, not what it asks
CLI_FLAGS = {field: (flag, options) for flag, field, options in JOB_FLAGS if field != "project"}


def _job(**kw: Any) -> Job:
    """A job with every field away from its default (a gang, an array, a fraction)."""
    fields: dict[str, Any] = {
        "pk": 42,
        "name": "Train A",
        "command": "python train.py --lr 3",
        "image": "pytorch:24.05",
        "gpus": 4,
        "gpu_milli": 500,
        "gpu_memory_mib": 1000,
        "min_gpu_memory_gb": 40,
        "precisions": ["bf16", "fp8"],
        "nodes": 2,
        "gpus_per_node": 4,
        "cpu_milli": 2500,
        "memory_mib": 4096,
        "shm_mib": 1024,
        "priority": 2,
        "preemptible": True,
        "runtime_estimate_s": 3600,
        "time_limit_s": 7200,
        "volumes": [
            {"name": "data", "path": "/data/in", "read_only": True},
            {"name": "ckpt", "path": "/data/ckpt", "read_only": False},
            {"name": "tmp", "path": "/tmp/s", "read_only": False, "kind": "scratch", "size_gib": 5},
        ],
        "checkpoint": "ckpt:runs/a",
        "working_dir": "/workspace/a",
        "env": {"A": "x y"},
        "max_restarts": 3,
        "elastic_min": 2,
        "elastic_max": 8,
        "shard_count": 3,
    }
    return Job(project=Project(slug="alpha", name="Alpha"), **(fields | kw))


def _absent_from(names: set[str], field: RequestField, surface: Surface) -> str | None:
    carry = field.on(surface)
    if isinstance(carry, Absent):
        return f"declared absent but present: {field.name}" if field.name in names else None
    return None if carry in names else f"does not carry {carry!r}"


def check_api_in(f: RequestField) -> str | None:
    return _absent_from(set(JobCreateSerializer().fields), f, Surface.API_IN)


def check_api_out(f: RequestField) -> str | None:
    return _absent_from(set(JobDetailSerializer().fields), f, Surface.API_OUT)


def check_form(f: RequestField) -> str | None:
    return _absent_from(set(JobForm().fields), f, Surface.FORM)


def check_model(f: RequestField) -> str | None:
    return _absent_from({x.name for x in Job._meta.concrete_fields}, f, Surface.MODEL)


def check_spec(f: RequestField) -> str | None:
    return _absent_from({x.name for x in dataclasses.fields(JobSpec)}, f, Surface.SPEC)


def check_template(f: RequestField) -> str | None:
    return _absent_from(set(job_request_body(_job())), f, Surface.TEMPLATE)


def check_assignment(f: RequestField) -> str | None:
    return _absent_from(set(typing.get_type_hints(Assignment)), f, Surface.ASSIGNMENT)


def check_cli(f: RequestField) -> str | None:
    if isinstance(f.cli, Absent):
        return f"declared absent but present: {f.name}" if f.name in CLI_FLAGS else None
    if f.name not in CLI_FLAGS:
        return f"no flag for {f.name}"
    flag, options = CLI_FLAGS[f.name]
    if flag != f.cli:
        return f"flag {flag}, declared {f.cli}"
    if f.kind == "int" and options.get("type") not in (int, _duration):
        return f"{flag} does not take a whole number"
    return None


def _handled(path: str) -> bool:
    """Whether the manifest parser's tables honour the key a declared path reads."""
    if key := annotation_key(path):
        return key.removeprefix("gpucloud.example/") in KNOWN_ANNOTATIONS
    if path == "metadata.name":
        return True
    for prefix, table in ((f"{C}.", CONTAINER_KEYS), (f"{POD}.", POD_KEYS), ("spec.", JOB_KEYS)):
        if path.startswith(prefix):
            return table.get(path[len(prefix) :].split(".")[0]) == HONOURED
    return False


def check_manifest_in(f: RequestField) -> str | None:
    path = f.manifest_in
    if isinstance(path, Absent):
        return None
    return None if _handled(path) else f"{path} is not honoured by the parser's tables"


def _lookup(doc: Any, path: str) -> bool:
    """Whether a dotted path (keys may hold dots: nvidia.com/gpu) is in the document."""
    if not path:
        return True
    if isinstance(doc, list):
        return any(_lookup(item, path) for item in doc)
    if not isinstance(doc, dict):
        return False
    for key in sorted(doc, key=len, reverse=True):
        if path == key or path.startswith(f"{key}."):
            return _lookup(doc[key], path[len(key) + 1 :])
    return False


def check_manifest_out(f: RequestField) -> str | None:
    path = f.manifest_out
    if isinstance(path, Absent):
        return None
    doc = job_manifest(_job(name="Train A", secret_env={"S": "s"}, gpu_model=None))
    if f.name in ("gpu_model", "gpu_models"):  # written from catalog rows: see the DB tests
        return None
    full = path.replace(C, "spec.template.spec.containers")
    return None if _lookup(doc, full) else f"the export has no {path}"


def check_slurm(f: RequestField) -> str | None:
    carry = f.slurm
    if isinstance(carry, Absent):
        return None
    cfg = SlurmPool(
        pool=Pool(name="hpc", backend=Pool.Backend.SLURM),
        cluster_name="hpc",
        partitions="gpu",
        gpu_types={"A100-80GB": "a100"},
        output_dir="/shared/portal/",
        storage_root="/shared/volumes",
    )
    batch = batch_job(
        cfg,
        _job(gpu_milli=1000, secret_env={"S": "s"}),
        shards=3,
        dependency="afterok:7",
        volume_ids={"data": 1, "ckpt": 2},
    )
    if carry.startswith("--"):
        return None if any(a.startswith(carry) for a in batch.args) else f"sbatch has no {carry}"
    if carry.endswith(" in the script") and carry.split()[0].isupper():  # an exported variable
        var = carry.split()[0].replace("<NAME>", "DATA")
        return None if f"export {var}=" in batch.script else f"the script has no {var}"
    value = getattr(_job(secret_env={"S": "s"}), str(f.model), None)
    wanted = next(iter(value)) if isinstance(value, dict) else value
    return None if wanted and str(wanted) in batch.script else f"the script has no {f.name}"


CHECKS: dict[Surface, Callable[[RequestField], str | None]] = {
    Surface.API_IN: check_api_in,
    Surface.API_OUT: check_api_out,
    Surface.FORM: check_form,
    Surface.MANIFEST_IN: check_manifest_in,
    Surface.MANIFEST_OUT: check_manifest_out,
    Surface.CLI: check_cli,
    Surface.SPEC: check_spec,
    Surface.MODEL: check_model,
    Surface.SLURM: check_slurm,
    Surface.ASSIGNMENT: check_assignment,
    Surface.TEMPLATE: check_template,
}


def gaps(fields: tuple[RequestField, ...]) -> list[str]:
    out = []
    for f in fields:
        for surface in Surface:
            carry = f.on(surface)
            if not (isinstance(carry, Absent) and carry.reason.strip()) and not (
                isinstance(carry, str) and carry
            ):
                out.append(f"{f.name} @ {surface}: neither carried nor absent with a reason")
            elif problem := CHECKS[surface](f):
                out.append(f"{f.name} @ {surface}: {problem}")
    return out


def test_every_surface_carries_or_declines_every_declared_field():
    assert gaps(FIELDS) == []


def test_every_surface_is_checked():
    assert set(CHECKS) == set(Surface)


def test_spec_api_and_cli_carry_nothing_undeclared():
    declared = {f.name for f in FIELDS}
    assert {x.name for x in dataclasses.fields(JobSpec)} - SPEC_EXTRAS == declared
    assert set(JobCreateSerializer().fields) - {"project"} == {
        str(f.api_in) for f in carried_on(Surface.API_IN)
    }
    assert set(CLI_FLAGS) == {f.name for f in carried_on(Surface.CLI)}


def _volumes(**surfaces: Any) -> RequestField:
    """A field no surface has (the name is nobody's key, unlike storage's real `volumes`)."""
    every = {str(s): "scratch_mounts_x" for s in Surface if s != Surface.SPEC}
    return RequestField(
        name="scratch_mounts_x", kind="str_list", help="mounts", **(every | surfaces)
    )


def test_a_new_field_no_surface_carries_is_named_at_every_surface():
    problems = gaps((_volumes(),))
    assert {p.split(" @ ")[1].split(":")[0] for p in problems} == {str(s) for s in Surface}


def test_a_new_field_must_answer_every_surface():
    with pytest.raises(TypeError, match="template"):
        RequestField(  # type: ignore[call-arg]
            name="volumes", kind="str_list", help="volumes",
            **{str(s): "volumes" for s in Surface if s not in (Surface.SPEC, Surface.TEMPLATE)},
        )  # fmt: skip
    declined = _volumes(template=Absent(" "))
    assert "scratch_mounts_x @ template: neither carried nor absent with a reason" in gaps(
        (declined,)
    )


def test_the_export_reads_back_as_the_same_request():
    """Every field a manifest carries both ways survives export then import."""
    job = _job(gpu_model=None, secret_env={})
    r = manifest_read(job_manifest(job), catalog=[])
    assert r.refused == []
    both = [
        f for f in carried_on(Surface.MANIFEST_IN) if f.carried_on(Surface.MANIFEST_OUT) is not None
    ]
    assert {f.name for f in both} <= set(r.values)
    for f in both:
        want = getattr(job, str(f.model))
        got = r.values[f.name]
        assert (list(got) if isinstance(got, tuple) else got) == want, f.name


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ("gpus", f"{CONTAINER}.resources.limits.nvidia.com/gpu"),
        ("cpu_milli", f"{CONTAINER}.resources"),
        ("time_limit_s", "spec.activeDeadlineSeconds"),
        ("nodes", "metadata.annotations.gpucloud.example/nodes"),
        ("image", f"{CONTAINER}.image"),
        ("dependencies", "manifest"),
        (None, "manifest"),
    ],
)
def test_a_validation_error_points_at_the_manifest_path(field, path):
    assert manifest_error_path(field, CONTAINER) == path


def test_the_api_bounds_are_the_declared_ones():
    fields = JobCreateSerializer().fields
    for f in carried_on(Surface.API_IN):
        if f.kind == "int":
            assert (fields[f.name].min_value, fields[f.name].max_value) == (
                f.minimum,
                f.maximum,
            ), f.name
    assert BY_NAME["gpus"].maximum == fields["elastic_max"].max_value


def test_every_named_mapper_exists():
    from scheduler import admission, dependencies, forms, job_templates, job_volumes
    from scheduler.backends.slurm import submit
    from scheduler.manifests import export, parse

    modules = {
        "admission": admission,
        "dependencies": dependencies,
        "export": export,
        "forms": forms,
        "job_templates": job_templates,
        "job_volumes": job_volumes,
        "parse": parse,
        "slurm": submit,
    }
    named = [m for f in FIELDS for m in f.mappers]
    assert named
    for mapper in named:
        module, _, name = mapper.partition(".")
        assert callable(getattr(modules[module], name, None)), mapper
