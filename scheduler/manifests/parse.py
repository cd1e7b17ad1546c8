"""A Kubernetes batch/v1 Job manifest as a job request, field by field.

Every field present is honoured (it changes the job), ignored (accepted, said so in the answer
and on the job page) or refused (a 400 that names each such field and why, all at once). The
table is docs/manifests.md; this module is its implementation, in the same order.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from portal.errors import DomainError
from scheduler.admission import JobSpec, spec_validate
from scheduler.manifests.fields import (
    GPU,
    GPU_LABELS,
    GPU_MODEL,
    QuantityError,
    cpu_milli,
    memory_mib,
    models_named,
)
from scheduler.manifests.schema import (
    API_VERSION,
    KIND,
    MAX_MANIFEST_BYTES,
    ManifestYamlError,
    load_yaml,
    schema_errors,
)
from scheduler.models import GpuModel, Job, PriorityClass

ANNOTATION = "gpucloud.example/"
SHM_PATH = "/dev/shm"  # noqa: S108  # a mount point in the container, not a temp file
MAX_BACKOFF = 10
KUBERNETES_BACKOFF_DEFAULT = 6
SHELL = ["/bin/sh", "-c"]  # what the node runs a command with: exported commands use it

Finding = dict[str, str]

# The portal's annotations: what a Kubernetes Job has no field for (exports write them).
NUMBER_ANNOTATIONS = (
    "runtime-estimate-seconds",
    "gpu-milli",
    "gpu-memory-mib",
    "nodes",
    "min-gpu-memory-gb",
    "elastic-min",
    "elastic-max",
)
KNOWN_ANNOTATIONS = (
    "name",
    "priority",
    "preemptible",
    "checkpoint-dir",
    "precisions",
    *NUMBER_ANNOTATIONS,
)


class ManifestRefused(DomainError):
    """The manifest has fields the portal cannot honour: `refused` names each one and why."""

    def __init__(self, refused: list[Finding], *, status: int = 400) -> None:
        first = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        super().__init__(f"{first['field']}: {first['why']}{more}", code="manifest_refused")
        self.refused = refused
        self.status = status


@dataclass(frozen=True)
class ManifestImport:
    spec: JobSpec
    namespace: str | None
    ignored: list[Finding]


# Why each ignored field does not change the job.
WHY_LABELS = "labels select Kubernetes objects; the portal has its own job list and filters."
WHY_ANNOTATIONS = f"only {ANNOTATION}* annotations mean something here."
WHY_CLUSTER_META = "set by a Kubernetes cluster, not by the one who submits."
WHY_TTL = "finished jobs stay in the portal's history; they are not garbage-collected."
WHY_TOLERATION = "GPU nodes here carry no taint: GPU jobs go to GPU nodes without it."
WHY_SUSPEND = "the portal's own queue decides when the job starts (as Kueue does)."
WHY_SELECTOR = "the portal tracks a job's pods itself."
WHY_PARALLELISM = "shards run as GPUs allow; the portal does not cap how many run at once."
WHY_NO_CLUSTER = "there is no Kubernetes API in the job's environment."
WHY_SCHEDULER = "the portal's scheduler places every job."
WHY_RUNTIME = "every job runs with the GPU container runtime."
WHY_PULL = "the node pulls images with its own settings."
WHY_PROBES = "a batch job runs to completion; nothing routes traffic to it."
WHY_GRACE = "the pool's grace period applies when a job is stopped."
WHY_DISK_EMPTYDIR = "the container's own filesystem is writable scratch space, gone when it ends."
WHY_SECURITY = "every job runs unprivileged, as the node's job user."
WHY_PREFERRED = "a preference, not a requirement: the pool's scorer places jobs."
WHY_PRIORITY = f"use the {ANNOTATION}priority annotation (low, normal, high, urgent)."
WHY_DNS = "jobs use the node's name resolution."
WHY_EPHEMERAL_STORAGE = "scratch space is not metered or limited per job."
WHY_QUEUE = "the portal's queue and the project's quota decide, not a Kueue LocalQueue."

REFUSE_NOT_SUPPORTED = "is not supported by the portal."
REFUSE_VOLUME = "only emptyDir volumes are offered (until projects have data volumes)."

IGNORED_POD = {
    "serviceAccount": WHY_NO_CLUSTER,
    "serviceAccountName": WHY_NO_CLUSTER,
    "automountServiceAccountToken": WHY_NO_CLUSTER,
    "enableServiceLinks": WHY_NO_CLUSTER,
    "schedulerName": WHY_SCHEDULER,
    "priorityClassName": WHY_PRIORITY,
    "priority": WHY_PRIORITY,
    "preemptionPolicy": WHY_SCHEDULER,
    "runtimeClassName": WHY_RUNTIME,
    "imagePullSecrets": WHY_PULL,
    "terminationGracePeriodSeconds": WHY_GRACE,
    "dnsPolicy": WHY_DNS,
    "dnsConfig": WHY_DNS,
    "securityContext": WHY_SECURITY,
    "topologySpreadConstraints": WHY_PREFERRED,
}
IGNORED_CONTAINER = {
    "name": "",  # required by Kubernetes, meaningless with one container: not reported
    "imagePullPolicy": WHY_PULL,
    "ports": WHY_PROBES,
    "livenessProbe": WHY_PROBES,
    "readinessProbe": WHY_PROBES,
    "startupProbe": WHY_PROBES,
    "lifecycle": WHY_PROBES,
    "terminationMessagePath": WHY_PROBES,
    "terminationMessagePolicy": WHY_PROBES,
    "stdin": WHY_PROBES,
    "stdinOnce": WHY_PROBES,
    "tty": WHY_PROBES,
}
CLUSTER_META = {
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
    "finalizers",
    "ownerReferences",
}


class _Reader:
    """Walks a schema-valid Job, collecting what it honours, ignores and refuses."""

    def __init__(self, catalog: list[GpuModel]) -> None:
        self.catalog = catalog
        self.ignored: list[Finding] = []
        self.refused: list[Finding] = []
        # Each GPU constraint (limits, nodeSelector, affinity) as the set of models it allows.
        self.model_sets: list[tuple[str, set[str]]] = []

    def ignore(self, field: str, why: str) -> None:
        self.ignored.append({"field": field, "why": why})

    def refuse(self, field: str, why: str) -> None:
        self.refused.append({"field": field, "why": why})

    def allow_models(self, field: str, values: list[str]) -> None:
        allowed: set[str] = set()
        for value in values:
            models = models_named(str(value), self.catalog)
            if not models:
                known = ", ".join(m.name for m in self.catalog)
                self.refuse(
                    field,
                    f"unknown GPU model '{value}': give a catalog model ({known}), a family such "
                    "as A100, or a GPU Feature Discovery product such as NVIDIA-A100-SXM4-80GB.",
                )
                return
            allowed |= {m.name for m in models}
        self.model_sets.append((field, allowed))

    # ------------------------------------------------------------------ metadata
    def metadata(self, meta: dict[str, Any], path: str, *, top: bool) -> None:
        for key, value in meta.items():
            if value is None or value == {} or value == []:
                continue
            where = f"{path}.{key}"
            if key == "labels":
                queue = isinstance(value, dict) and "kueue.x-k8s.io/queue-name" in value
                self.ignore(where, WHY_LABELS + (f" {WHY_QUEUE}" if queue else ""))
            elif key == "annotations":
                for name in value:
                    if not (top and str(name).startswith(ANNOTATION)):
                        self.ignore(f"{where}.{name}", WHY_ANNOTATIONS)
            elif key in CLUSTER_META:
                self.ignore(where, WHY_CLUSTER_META)
            elif top and key in ("name", "generateName", "namespace"):
                continue
            else:
                self.ignore(
                    where, "names and places Kubernetes objects; the job is named by its Job."
                )

    # ------------------------------------------------------------------ node choice
    def node_selector(self, selector: dict[str, Any], path: str) -> None:
        for key, value in selector.items():
            where = f"{path}.{key}"
            if key in GPU_LABELS:
                self.allow_models(where, [str(value)])
            else:
                self.refuse(
                    where,
                    "only nvidia.com/gpu.product and nvidia.com/gpu.model choose nodes here.",
                )

    def affinity(self, affinity: dict[str, Any], path: str) -> None:
        for key, value in affinity.items():
            if value is None:
                continue
            where = f"{path}.{key}"
            if key != "nodeAffinity":
                self.refuse(where, "pod placement relative to other pods " + REFUSE_NOT_SUPPORTED)
                continue
            for kind, rule in value.items():
                if rule is None:
                    continue
                rule_path = f"{where}.{kind}"
                if kind == "preferredDuringSchedulingIgnoredDuringExecution":
                    self.ignore(rule_path, WHY_PREFERRED)
                elif kind == "requiredDuringSchedulingIgnoredDuringExecution":
                    self.required_terms(rule.get("nodeSelectorTerms") or [], rule_path)
                else:
                    self.refuse(rule_path, REFUSE_NOT_SUPPORTED)

    def required_terms(self, terms: list[dict[str, Any]], path: str) -> None:
        """Terms are alternatives (any of them), the expressions of a term all hold."""
        union: set[str] = set()
        before = len(self.refused)
        for t, term in enumerate(terms):
            term_path = f"{path}.nodeSelectorTerms[{t}]"
            if term.get("matchFields"):
                self.refuse(f"{term_path}.matchFields", REFUSE_NOT_SUPPORTED)
            allowed: set[str] | None = None
            for e, expr in enumerate(term.get("matchExpressions") or []):
                expr_path = f"{term_path}.matchExpressions[{e}]"
                key, op = expr.get("key"), expr.get("operator")
                if key not in GPU_LABELS:
                    self.refuse(
                        f"{expr_path}.key",
                        f"'{key}': only nvidia.com/gpu.product and nvidia.com/gpu.model "
                        "choose nodes here.",
                    )
                    continue
                if op != "In":
                    self.refuse(
                        f"{expr_path}.operator",
                        f"'{op}': only In (any of these GPUs) is supported on {key}.",
                    )
                    continue
                mark = len(self.model_sets)
                self.allow_models(f"{expr_path}.values", list(expr.get("values") or []))
                if len(self.model_sets) > mark:
                    models = self.model_sets.pop()[1]
                    allowed = models if allowed is None else allowed & models
            if allowed is not None:
                union |= allowed
        if len(self.refused) == before and union:
            self.model_sets.append((path, union))

    def tolerations(self, tolerations: list[dict[str, Any]], path: str) -> None:
        for i, toleration in enumerate(tolerations):
            key = str(toleration.get("key") or "")
            if key.startswith("nvidia.com/"):
                self.ignore(f"{path}[{i}]", WHY_TOLERATION)
            else:
                self.refuse(
                    f"{path}[{i}]",
                    f"a toleration of '{key or 'every taint'}': the portal's nodes have only GPU "
                    "taints (nvidia.com/gpu), which need no toleration.",
                )

    def volumes(self, volumes: list[dict[str, Any]], path: str) -> dict[str, dict[str, Any]]:
        """The emptyDir volumes by name; every other kind is refused."""
        out: dict[str, dict[str, Any]] = {}
        for i, volume in enumerate(volumes):
            kinds = [k for k, v in volume.items() if k != "name" and v is not None]
            if kinds == ["emptyDir"]:
                out[str(volume.get("name"))] = volume["emptyDir"] or {}
            else:
                for kind in kinds or ["(none)"]:
                    self.refuse(f"{path}[{i}].{kind}", REFUSE_VOLUME)
        return out


def _spec_error_path(field: str | None, cpath: str) -> str:
    """Where a JobSpec validation error comes from in the manifest."""
    return {
        "name": "metadata.name",
        "command": f"{cpath}.command",
        "gpus": f"{cpath}.resources.limits.{GPU}",
        "gpu_milli": f"metadata.annotations.{ANNOTATION}gpu-milli",
        "gpu_memory_mib": f"metadata.annotations.{ANNOTATION}gpu-memory-mib",
        "nodes": f"metadata.annotations.{ANNOTATION}nodes",
        "precisions": f"metadata.annotations.{ANNOTATION}precisions",
        "elastic_min": f"metadata.annotations.{ANNOTATION}elastic-min",
        "gpu_models": f"{cpath}.resources.limits.{GPU_MODEL}",
        "min_gpu_memory_gb": f"{cpath}.resources.limits.{GPU_MODEL}",
        "cpu_milli": f"{cpath}.resources",
        "memory_mib": f"{cpath}.resources",
        "shm_mib": "spec.template.spec.volumes",
        "env": f"{cpath}.env",
        "working_dir": f"{cpath}.workingDir",
        "checkpoint_dir": f"metadata.annotations.{ANNOTATION}checkpoint-dir",
        "runtime_estimate_s": f"metadata.annotations.{ANNOTATION}runtime-estimate-seconds",
        "time_limit_s": "spec.activeDeadlineSeconds",
        "max_restarts": "spec.backoffLimit",
        "shard_count": "spec.completions",
        "priority": f"metadata.annotations.{ANNOTATION}priority",
    }.get(field or "", "manifest")


def manifest_text(raw: str | bytes) -> str:
    """The manifest as text within the size cap (a 413 past it)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestRefused(
            [
                {
                    "field": "manifest",
                    "why": f"is larger than {MAX_MANIFEST_BYTES // 1024} KiB; a Job manifest "
                    "is a few KiB.",
                }
            ],
            status=413,
        )
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ManifestRefused([{"field": "manifest", "why": "is not UTF-8 text."}]) from None
    return raw


def load_manifest(raw: str | bytes) -> dict[str, Any]:
    """The manifest's document, schema-checked; ManifestRefused names every fault."""
    text = manifest_text(raw)
    try:
        doc = load_yaml(text)
    except ManifestYamlError as exc:
        raise ManifestRefused([{"field": "manifest", "why": str(exc)}]) from None
    if not isinstance(doc, dict):
        raise ManifestRefused([{"field": "manifest", "why": "must be a mapping: a Job object."}])
    refused = []
    if doc.get("apiVersion") != API_VERSION:
        refused.append(
            {
                "field": "apiVersion",
                "why": f"'{doc.get('apiVersion')}': only {API_VERSION} is accepted.",
            }
        )
    if doc.get("kind") != KIND:
        refused.append({"field": "kind", "why": f"'{doc.get('kind')}': only {KIND} is accepted."})
    if refused:
        raise ManifestRefused(refused)
    errors = schema_errors(doc)
    if errors:
        raise ManifestRefused(errors)
    return doc


def parse_manifest(raw: str | bytes) -> ManifestImport:
    """The job a Kubernetes Job manifest asks for, the namespace it names, what was ignored."""
    doc = load_manifest(raw)
    catalog = list(GpuModel.objects.filter(is_active=True))
    r = _Reader(catalog)
    for key in doc:
        if key == "status" and doc[key] is not None:
            r.ignore("status", WHY_CLUSTER_META)
    meta = doc.get("metadata") or {}
    r.metadata(meta, "metadata", top=True)
    name = meta.get("name") or meta.get("generateName")
    if not isinstance(name, str) or not name.strip():
        r.refuse("metadata.name", "is required: it names the job.")
        name = "job"
    annotations = meta.get("annotations") or {}

    spec = doc.get("spec") or {}
    template = spec.get("template") or {}
    r.metadata(template.get("metadata") or {}, "spec.template.metadata", top=False)
    pod = template.get("spec") or {}
    pod_path = "spec.template.spec"

    # --- the Job's own fields
    shard_count = 1
    completions, parallelism = spec.get("completions"), spec.get("parallelism")
    indexed = spec.get("completionMode") == "Indexed"
    if indexed:
        if completions is None:
            r.refuse("spec.completions", "an Indexed Job needs completions: the shard count.")
        else:
            shard_count = completions
            if parallelism is not None and parallelism != completions:
                r.ignore("spec.parallelism", WHY_PARALLELISM)
    else:
        if completions not in (None, 1):
            r.refuse(
                "spec.completions",
                "more than one completion is supported as an array: add completionMode: Indexed.",
            )
        if parallelism not in (None, 1):
            r.refuse(
                "spec.parallelism",
                "a work queue of parallel pods is not supported; use completionMode: Indexed.",
            )
    backoff = spec.get("backoffLimit")
    if backoff is None:
        backoff = KUBERNETES_BACKOFF_DEFAULT
    elif not 0 <= backoff <= MAX_BACKOFF:
        r.refuse("spec.backoffLimit", f"{backoff}: at most {MAX_BACKOFF} restarts are allowed.")
        backoff = 0
    time_limit = spec.get("activeDeadlineSeconds")
    if pod.get("activeDeadlineSeconds") is not None:
        pod_limit = pod["activeDeadlineSeconds"]
        time_limit = pod_limit if time_limit is None else min(time_limit, pod_limit)
    if spec.get("ttlSecondsAfterFinished") is not None:
        r.ignore("spec.ttlSecondsAfterFinished", WHY_TTL)
    if spec.get("suspend"):
        r.ignore("spec.suspend", WHY_SUSPEND)
    for key in ("selector", "manualSelector"):
        if spec.get(key) is not None:
            r.ignore(f"spec.{key}", WHY_SELECTOR)
    for key in (
        "backoffLimitPerIndex",
        "maxFailedIndexes",
        "podFailurePolicy",
        "successPolicy",
        "podReplacementPolicy",
        "managedBy",
    ):
        if spec.get(key) is not None:
            r.refuse(f"spec.{key}", REFUSE_NOT_SUPPORTED)

    # --- the pod
    honoured_pod = {
        "containers",
        "restartPolicy",
        "nodeSelector",
        "affinity",
        "tolerations",
        "volumes",
        "activeDeadlineSeconds",
    }
    for key, value in pod.items():
        if value is None or key in honoured_pod:
            continue
        where = f"{pod_path}.{key}"
        if key in ("hostNetwork", "hostIPC", "hostPID"):
            if value:
                r.refuse(where, "jobs never share the node's network, IPC or process namespaces.")
        elif key == "hostUsers":
            if value is False:
                continue
            r.ignore(where, WHY_SECURITY)
        elif key == "initContainers" and value:
            r.refuse(where, "init containers are not supported: run the steps in the command.")
        elif key == "ephemeralContainers" and value:
            r.refuse(where, REFUSE_NOT_SUPPORTED)
        elif key in IGNORED_POD:
            r.ignore(where, IGNORED_POD[key])
        elif value not in ([], {}, False):
            r.refuse(where, REFUSE_NOT_SUPPORTED)
    if pod.get("nodeSelector"):
        r.node_selector(pod["nodeSelector"], f"{pod_path}.nodeSelector")
    if pod.get("affinity"):
        r.affinity(pod["affinity"], f"{pod_path}.affinity")
    if pod.get("tolerations"):
        r.tolerations(pod["tolerations"], f"{pod_path}.tolerations")
    empty_dirs = r.volumes(pod.get("volumes") or [], f"{pod_path}.volumes")

    containers = pod.get("containers") or []
    for i in range(1, len(containers)):
        r.refuse(
            f"{pod_path}.containers[{i}]",
            "only one container is supported: run helpers inside it.",
        )
    cpath = f"{pod_path}.containers[0]"
    c: dict[str, Any] = containers[0] if containers else {}
    if not containers:
        r.refuse(f"{pod_path}.containers", "give one container.")
    for key, value in c.items():
        if value is None:
            continue
        where = f"{cpath}.{key}"
        if key in (
            "image",
            "command",
            "args",
            "workingDir",
            "env",
            "resources",
            "volumeMounts",
            "securityContext",
        ):
            continue
        if key in IGNORED_CONTAINER:
            if IGNORED_CONTAINER[key]:
                r.ignore(where, IGNORED_CONTAINER[key])
        elif key == "envFrom" and value:
            r.refuse(
                where, "environment from ConfigMaps and Secrets is not supported; give values."
            )
        elif value not in ([], {}):
            r.refuse(where, REFUSE_NOT_SUPPORTED)

    security = c.get("securityContext") or {}
    for key, value in security.items():
        if value is None:
            continue
        where = f"{cpath}.securityContext.{key}"
        if key == "privileged" and value:
            r.refuse(where, "privileged containers are not allowed.")
        elif key == "allowPrivilegeEscalation" and value:
            r.refuse(where, "privilege escalation is not allowed.")
        elif key == "capabilities" and (value.get("add") or []):
            r.refuse(f"{where}.add", "no capabilities can be added.")
        elif key not in ("privileged", "allowPrivilegeEscalation"):
            r.ignore(where, WHY_SECURITY)

    argv = [str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
    if not argv and containers:
        r.refuse(
            f"{cpath}.command", "give the command to run (the image's entrypoint is not read)."
        )
    command = argv[2] if len(argv) == 3 and argv[:2] == SHELL else shlex.join(argv)

    env: dict[str, str] = {}
    for i, item in enumerate(c.get("env") or []):
        if item.get("valueFrom") is not None:
            r.refuse(
                f"{cpath}.env[{i}].valueFrom",
                f"{item.get('name')}: values from Secrets, ConfigMaps or fields are not "
                "supported; give a value.",
            )
            continue
        env[str(item.get("name", ""))] = str(item.get("value") or "")

    # --- resources
    resources = c.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    rpath = f"{cpath}.resources"
    for key in resources:
        if key not in ("limits", "requests") and resources[key] is not None:
            r.refuse(f"{rpath}.{key}", REFUSE_NOT_SUPPORTED)
    gpus = 1
    if GPU not in limits:
        r.refuse(f"{rpath}.limits.{GPU}", "is required: how many GPUs the job needs.")
    else:
        try:
            gpus = int(str(limits[GPU]))
        except ValueError:
            r.refuse(f"{rpath}.limits.{GPU}", f"'{limits[GPU]}' is not a whole number of GPUs.")
        if GPU in requests and str(requests[GPU]) != str(limits[GPU]):
            r.refuse(f"{rpath}.requests.{GPU}", "must equal the limit, as Kubernetes requires.")
    if limits.get(GPU_MODEL) is not None:
        r.allow_models(f"{rpath}.limits.{GPU_MODEL}", [str(limits[GPU_MODEL])])
    if requests.get(GPU_MODEL) is not None and requests.get(GPU_MODEL) != limits.get(GPU_MODEL):
        r.allow_models(f"{rpath}.requests.{GPU_MODEL}", [str(requests[GPU_MODEL])])
    sizes: dict[str, int] = {}
    for kind, parse in (("cpu", cpu_milli), ("memory", memory_mib)):
        amounts = {}
        for side, values in (("requests", requests), ("limits", limits)):
            if values.get(kind) is None:
                continue
            try:
                amounts[side] = parse(values[kind])
            except QuantityError as exc:
                r.refuse(
                    f"{rpath}.{side}.{kind}",
                    f"{exc} (e.g. {'500m or 4' if kind == 'cpu' else '512Mi or 16Gi'}).",
                )
        if (
            "requests" in amounts
            and "limits" in amounts
            and amounts["requests"] > amounts["limits"]
        ):
            r.refuse(f"{rpath}.requests.{kind}", "is more than the limit.")
        # The node reserves, and holds the job to, the limit (the request without one).
        sizes[kind] = amounts.get("limits", amounts.get("requests", 0))
    for side, values in (("requests", requests), ("limits", limits)):
        for key in values:
            if key in (GPU, GPU_MODEL, "cpu", "memory"):
                continue
            if key == "ephemeral-storage":
                r.ignore(f"{rpath}.{side}.{key}", WHY_EPHEMERAL_STORAGE)
            else:
                r.refuse(f"{rpath}.{side}.{key}", f"the resource '{key}' is not offered.")

    # --- volumes and mounts: emptyDir only; a memory-backed one at /dev/shm is shared memory
    shm_mib = 0
    mounted: set[str] = set()
    for i, mount in enumerate(c.get("volumeMounts") or []):
        where = f"{cpath}.volumeMounts[{i}]"
        vol_name, mount_path = str(mount.get("name")), str(mount.get("mountPath"))
        mounted.add(vol_name)
        extra = [
            k
            for k, v in mount.items()
            if k not in ("name", "mountPath", "readOnly") and v not in (None, "")
        ]
        for key in extra:
            r.refuse(f"{where}.{key}", REFUSE_NOT_SUPPORTED)
        if vol_name not in empty_dirs:
            if not any(f["field"].startswith(f"{pod_path}.volumes") for f in r.refused):
                r.refuse(f"{where}.name", f"no emptyDir volume named '{vol_name}'.")
            continue
        empty_dir = empty_dirs[vol_name]
        if empty_dir.get("medium") == "Memory":
            if mount_path.rstrip("/") != SHM_PATH:
                r.refuse(
                    f"{where}.mountPath",
                    f"'{mount_path}': a memory-backed volume is offered at {SHM_PATH} only.",
                )
                continue
            size = empty_dir.get("sizeLimit")
            if size is not None:
                try:
                    shm_mib = memory_mib(size)
                except QuantityError as exc:
                    r.refuse(f"{pod_path}.volumes.{vol_name}.emptyDir.sizeLimit", f"{exc}.")
            elif sizes["memory"]:
                shm_mib = sizes["memory"]  # Kubernetes counts it against the memory limit
            else:
                r.refuse(
                    f"{pod_path}.volumes.{vol_name}.emptyDir.sizeLimit",
                    "give a sizeLimit (or a memory limit): shared memory needs a size.",
                )
        else:
            r.ignore(f"{where}", f"{mount_path}: {WHY_DISK_EMPTYDIR}")
    for vol_name in empty_dirs:
        if vol_name not in mounted:
            r.ignore(f"{pod_path}.volumes.{vol_name}", "not mounted by the container.")

    # --- the GPU model(s): every constraint holds, each allows any of its models
    gpu_model: GpuModel | None = None
    gpu_models: tuple[str, ...] = ()
    if r.model_sets:
        allowed = set.intersection(*(s for _, s in r.model_sets))
        if not allowed:
            fields = " and ".join(f for f, _ in r.model_sets)
            for field, models in r.model_sets:
                r.refuse(
                    field,
                    f"means {' or '.join(sorted(models))}; no catalog GPU model satisfies "
                    f"{fields} together.",
                )
        else:
            ordered = [m for m in catalog if m.name in allowed]
            if len(ordered) == 1:
                gpu_model = ordered[0]
            else:
                gpu_models = tuple(m.name for m in ordered)

    # --- the portal's own annotations: what Kubernetes has no field for
    priority_name = str(annotations.get(f"{ANNOTATION}priority", "normal")).upper()
    if priority_name not in PriorityClass.names:
        r.refuse(f"metadata.annotations.{ANNOTATION}priority", "use low, normal, high or urgent.")
        priority_name = "NORMAL"
    numbers: dict[str, int | None] = {}
    for key in NUMBER_ANNOTATIONS:
        value = annotations.get(f"{ANNOTATION}{key}")
        numbers[key] = None
        if value is not None:
            if str(value).isdigit() and len(str(value)) < 10:
                numbers[key] = int(str(value))
            else:
                r.refuse(f"metadata.annotations.{ANNOTATION}{key}", "a whole number.")
    precisions_text = str(annotations.get(f"{ANNOTATION}precisions") or "")
    for key in annotations:
        if str(key).startswith(ANNOTATION) and str(key)[len(ANNOTATION) :] not in KNOWN_ANNOTATIONS:
            r.refuse(
                f"metadata.annotations.{key}",
                f"unknown; the {ANNOTATION} annotations are " + ", ".join(KNOWN_ANNOTATIONS) + ".",
            )
    nodes = numbers["nodes"]
    job_name = str(annotations.get(f"{ANNOTATION}name") or name)

    if r.refused:
        raise ManifestRefused(r.refused)
    job_spec = JobSpec(
        name=job_name.strip()[:100],
        command=command,
        image=str(c.get("image") or "")[:300],
        env=env,
        gpus=gpus,
        gpu_model=gpu_model,
        gpu_models=gpu_models,
        cpu_milli=sizes["cpu"],
        memory_mib=sizes["memory"],
        shm_mib=shm_mib,
        priority=PriorityClass[priority_name].value,
        preemptible=str(annotations.get(f"{ANNOTATION}preemptible", "false")).lower() == "true",
        runtime_estimate_s=numbers["runtime-estimate-seconds"],
        gpu_milli=numbers["gpu-milli"] or 1000,
        gpu_memory_mib=numbers["gpu-memory-mib"] or 0,
        nodes=nodes,
        gpus_per_node=gpus if nodes is not None else None,
        min_gpu_memory_gb=numbers["min-gpu-memory-gb"] or 0,
        precisions=tuple(p for p in precisions_text.replace(" ", "").split(",") if p),
        elastic_min=numbers["elastic-min"],
        elastic_max=numbers["elastic-max"],
        time_limit_s=time_limit,
        checkpoint_dir=str(annotations.get(f"{ANNOTATION}checkpoint-dir") or ""),
        working_dir=str(c.get("workingDir") or ""),
        max_restarts=backoff,
        shard_count=shard_count,
        source=Job.Source.MANIFEST,
        manifest_ignored=tuple(r.ignored),
    )
    try:
        job_spec = spec_validate(job_spec)
    except DomainError as exc:
        raise ManifestRefused(
            [{"field": _spec_error_path(exc.field, cpath), "why": exc.message}]
        ) from None
    namespace = meta.get("namespace")
    return ManifestImport(job_spec, str(namespace) if namespace else None, r.ignored)
