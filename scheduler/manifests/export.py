"""Any job as a Kubernetes batch/v1 Job manifest: what it asks for, in the fields the import
honours, so that importing it again asks for the same thing and a cluster can run it."""

from __future__ import annotations

import re
from typing import Any

import yaml

from scheduler.job_request import annotation_key
from scheduler.manifests.fields import (
    GPU,
    GPU_PRODUCT,
    cpu_quantity,
    mib_quantity,
    product_label,
)
from scheduler.manifests.parse import ANNOTATION, NUMBER_FIELDS, SHELL, SHM_PATH
from scheduler.models import GpuModel, Job, PriorityClass


def _k8s_name(name: str) -> str:
    """A DNS-1123 name from a job's name: lower case, dashes, at most 63 characters."""
    text = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return text or "job"


def _container(job: Job) -> dict[str, Any]:
    """The one container: command, image, working directory, environment, limits."""
    container: dict[str, Any] = {"name": "main", "command": [*SHELL, job.command]}
    if job.image:
        container["image"] = job.image
    if job.working_dir:
        container["workingDir"] = job.working_dir
    if job.env or job.secret_env:
        # secret values are never shown: the manifest names them with the mask
        container["env"] = [
            {"name": k, "value": v} for k, v in sorted({**job.env, **job.secret_env_masked}.items())
        ]
    limits: dict[str, Any] = {GPU: job.gpus_per_node if job.nodes else job.gpus}
    if job.cpu_milli:
        limits["cpu"] = cpu_quantity(job.cpu_milli)
    if job.memory_mib:
        limits["memory"] = mib_quantity(job.memory_mib)
    container["resources"] = {"limits": limits}
    return container


def _affinity(job: Job) -> dict[str, Any] | None:
    """The GPU model(s) as a required node affinity on the GPU product label, or None."""
    models = (
        [job.gpu_model]
        if job.gpu_model is not None
        else list(GpuModel.objects.filter(name__in=job.gpu_models))
        if job.gpu_models
        else []
    )
    if not models:
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": GPU_PRODUCT,
                                "operator": "In",
                                "values": sorted(product_label(m) for m in models),
                            }
                        ]
                    }
                ]
            }
        }
    }


def _volumes(job: Job) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the container's mounts: the project's volumes as claims of the
    same name, scratch as a disk emptyDir with its sizeLimit, shared memory at /dev/shm."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for m in job.volumes or []:
        if m.get("kind") == "scratch":
            volumes.append({"name": m["name"], "emptyDir": {"sizeLimit": f"{m['size_gib']}Gi"}})
        else:
            volumes.append({"name": m["name"], "persistentVolumeClaim": {"claimName": m["name"]}})
        mount = {"name": m["name"], "mountPath": m["path"]}
        if m.get("read_only"):
            mount["readOnly"] = True
        mounts.append(mount)
    if job.shm_mib:
        mounts.append({"name": "dshm", "mountPath": SHM_PATH})
        volumes.append(
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": mib_quantity(job.shm_mib)},
            }
        )
    return volumes, mounts


def job_manifest(job: Job) -> dict[str, Any]:
    """The batch/v1 Job a job (an array's first shard: the whole array) amounts to."""
    container = _container(job)
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if (affinity := _affinity(job)) is not None:
        pod["affinity"] = affinity
    volumes, mounts = _volumes(job)
    if volumes:
        container["volumeMounts"] = mounts
        pod["volumes"] = volumes
    annotations = {
        f"{ANNOTATION}priority": PriorityClass(job.priority).name.lower(),
        f"{ANNOTATION}preemptible": "true" if job.preemptible else "false",
    }
    if job.checkpoint:
        annotations[f"{ANNOTATION}checkpoint"] = job.checkpoint
    if job.precisions:
        annotations[f"{ANNOTATION}precisions"] = ",".join(job.precisions)
    for field in NUMBER_FIELDS:  # the whole-number annotations, unless at their default
        value = getattr(job, str(field.model))
        if value is not None and value != field.default:
            annotations[str(annotation_key(field.manifest_out))] = str(value)
    spec: dict[str, Any] = {"backoffLimit": job.max_restarts, "template": {"spec": pod}}
    if job.time_limit_s:
        spec["activeDeadlineSeconds"] = job.time_limit_s
    if job.shard_count and job.shard_count > 1:
        spec |= {
            "completionMode": "Indexed",
            "completions": job.shard_count,
            "parallelism": job.shard_count,
        }
    name = re.sub(r"\[\d+\]$", "", job.name) if job.shard_index is not None else job.name
    if _k8s_name(name) != name:
        annotations[f"{ANNOTATION}name"] = name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": _k8s_name(name),
            "namespace": job.project.slug,
            "annotations": annotations,
        },
        "spec": spec,
    }


def job_manifest_yaml(job: Job) -> str:
    header = f"# Job #{job.pk} {job.name!r} as a Kubernetes batch/v1 Job.\n"
    return header + yaml.safe_dump(job_manifest(job), sort_keys=False, allow_unicode=True)
