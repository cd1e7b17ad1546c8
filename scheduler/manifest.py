"""Kubernetes Job manifests as job requests: `nvidia.com/gpu` limits become a JobSpec.

Accepted: `apiVersion: batch/v1`, `kind: Job`, one container. `metadata.namespace` names the
project when the caller does not. Errors name the manifest path at fault.
"""

from __future__ import annotations

import re
import shlex
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml

from portal.errors import DomainError
from scheduler.admission import JobSpec
from scheduler.models import GpuModel, Job, PriorityClass

MAX_MANIFEST_BYTES = 256 * 1024
GPU = "nvidia.com/gpu"
GPU_MODEL = "nvidia.com/gpu.model"
GPU_PRODUCT = "nvidia.com/gpu.product"
ANNOTATION = "gpucloud.example/"
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")
_BINARY = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
_DECIMAL = {"": 1 / (1024 * 1024), "k": 1000 / 1024**2, "M": 1e6 / 1024**2, "G": 1e9 / 1024**2}


def _bad(path: str, message: str) -> DomainError:
    return DomainError(f"{path}: {message}", field="manifest")


def _map(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(path, "expected a mapping.")
    return value


def cpu_milli(value: Any, path: str) -> int:
    text = str(value).strip()
    try:
        if text.endswith("m"):
            return int(text[:-1])
        return int(Decimal(text) * 1000)
    except (InvalidOperation, ValueError):
        raise _bad(path, f"'{text}' is not a CPU quantity (e.g. 4 or 500m).") from None


def memory_mib(value: Any, path: str) -> int:
    match = _QUANTITY.match(str(value).strip())
    if not match or (match[2] not in _BINARY and match[2] not in _DECIMAL):
        raise _bad(path, f"'{value}' is not a memory quantity (e.g. 16Gi or 512Mi).")
    factor = _BINARY.get(match[2]) or _DECIMAL[match[2]]
    return int(float(match[1]) * factor)


def parse_manifest(text: str | bytes) -> tuple[JobSpec, str | None]:
    """Parse a manifest into a JobSpec and the namespace it names (or None)."""
    if isinstance(text, bytes):
        if len(text) > MAX_MANIFEST_BYTES:
            raise _bad("manifest", f"larger than {MAX_MANIFEST_BYTES // 1024} KiB.")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad("manifest", "is not UTF-8 text.") from None
    if len(text) > MAX_MANIFEST_BYTES:
        raise _bad("manifest", f"larger than {MAX_MANIFEST_BYTES // 1024} KiB.")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _bad("manifest", f"is not valid YAML ({str(exc).splitlines()[0]}).") from None
    doc = _map(doc, "manifest")
    if doc.get("kind") != "Job":
        raise _bad("kind", "must be Job.")
    if not str(doc.get("apiVersion", "")).startswith("batch/"):
        raise _bad("apiVersion", "must be batch/v1.")
    meta = _map(doc.get("metadata"), "metadata")
    name = meta.get("name") or meta.get("generateName")
    if not isinstance(name, str) or not name.strip():
        raise _bad("metadata.name", "is required.")
    annotations = _map(meta.get("annotations"), "metadata.annotations")
    spec = _map(doc.get("spec"), "spec")
    pod = _map(_map(spec.get("template"), "spec.template").get("spec"), "spec.template.spec")
    containers = pod.get("containers")
    if not isinstance(containers, list) or len(containers) != 1:
        raise _bad("spec.template.spec.containers", "exactly one container is supported.")
    c = _map(containers[0], "spec.template.spec.containers[0]")
    cpath = "spec.template.spec.containers[0]"
    command = c.get("command") or []
    args = c.get("args") or []
    if not isinstance(command, list) or not isinstance(args, list):
        raise _bad(f"{cpath}.command", "command and args must be lists of strings.")
    argv = [str(a) for a in [*command, *args]]
    if not argv:
        raise _bad(f"{cpath}.command", "give the command to run.")
    env: dict[str, str] = {}
    for i, item in enumerate(c.get("env") or []):
        item = _map(item, f"{cpath}.env[{i}]")
        if "valueFrom" in item:
            raise _bad(f"{cpath}.env[{i}]", "valueFrom is not supported; give a value.")
        env[str(item.get("name", ""))] = str(item.get("value", ""))
    resources = _map(c.get("resources"), f"{cpath}.resources")
    limits = _map(resources.get("limits"), f"{cpath}.resources.limits")
    requests = _map(resources.get("requests"), f"{cpath}.resources.requests")
    lpath = f"{cpath}.resources.limits"
    if GPU not in limits:
        raise _bad(f"{lpath}.{GPU}", "is required: how many GPUs the job needs.")
    try:
        gpus = int(str(limits[GPU]))
    except ValueError:
        raise _bad(f"{lpath}.{GPU}", f"'{limits[GPU]}' is not a whole number of GPUs.") from None
    if gpus < 1:
        raise _bad(f"{lpath}.{GPU}", "must be at least 1.")
    model_name = limits.get(GPU_MODEL) or _map(pod.get("nodeSelector"), "nodeSelector").get(
        GPU_PRODUCT
    )
    gpu_model = None
    if model_name:
        gpu_model = GpuModel.objects.filter(name=str(model_name), is_active=True).first()
        if gpu_model is None:
            gpu_model = next(
                (
                    m
                    for m in GpuModel.objects.filter(is_active=True)
                    if str(model_name) in m.nvml_names
                ),
                None,
            )
        if gpu_model is None:
            known = ", ".join(GpuModel.objects.values_list("name", flat=True))
            raise _bad(
                f"{lpath}.{GPU_MODEL}", f"unknown GPU model '{model_name}'; use one of {known}."
            )
    cpu = limits.get("cpu", requests.get("cpu"))
    memory = limits.get("memory", requests.get("memory"))
    completions = spec.get("completions")
    shard_count = 1
    if spec.get("completionMode") == "Indexed" and completions is not None:
        if not isinstance(completions, int):
            raise _bad("spec.completions", "must be a whole number.")
        shard_count = completions
    backoff = spec.get("backoffLimit", 0)
    if not isinstance(backoff, int) or backoff < 0:
        raise _bad("spec.backoffLimit", "must be a whole number ≥ 0.")
    priority_name = str(annotations.get(f"{ANNOTATION}priority", "normal")).upper()
    if priority_name not in PriorityClass.names:
        raise _bad(f"metadata.annotations.{ANNOTATION}priority", "use low, normal, high or urgent.")
    runtime = annotations.get(f"{ANNOTATION}runtime-estimate-seconds")
    try:
        runtime_s = int(runtime) if runtime is not None else spec.get("activeDeadlineSeconds")
    except ValueError:
        raise _bad(
            f"metadata.annotations.{ANNOTATION}runtime-estimate-seconds", "seconds, a whole number."
        ) from None
    job_spec = JobSpec(
        name=str(name).strip()[:100],
        command=shlex.join(argv),
        image=str(c.get("image", ""))[:300],
        env=env,
        gpus=gpus,
        gpu_model=gpu_model,
        cpu_milli=cpu_milli(cpu, f"{lpath}.cpu") if cpu is not None else 0,
        memory_mib=memory_mib(memory, f"{lpath}.memory") if memory is not None else 0,
        priority=PriorityClass[priority_name].value,
        preemptible=str(annotations.get(f"{ANNOTATION}preemptible", "false")).lower() == "true",
        runtime_estimate_s=runtime_s if isinstance(runtime_s, int) else None,
        checkpoint_dir=str(annotations.get(f"{ANNOTATION}checkpoint-dir", "")),
        working_dir=str(c.get("workingDir", "")),
        max_restarts=min(backoff, 10),
        shard_count=shard_count,
        source=Job.Source.MANIFEST,
    )
    namespace = meta.get("namespace")
    return job_spec, str(namespace) if namespace else None
