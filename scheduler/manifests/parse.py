"""A Kubernetes batch/v1 Job manifest as a job request, field by field.

Every field present is honoured (it changes the job), ignored (accepted, said so in the answer
and on the job page) or refused (a 400 that names each such field and why, all at once). The
table is docs/manifests.md; this module is its implementation: the keys of the Job, its pod and
its container are tables (`JOB_KEYS`, `POD_KEYS`, `CONTAINER_KEYS`: honoured by a named step,
ignored or refused with the reason) walked by `walk`, and `manifest_read` runs the named steps
that read the honoured keys into the spec's fields. Which manifest path each job-request field
is read from, and where a validation error points, is declared in `scheduler.job_request`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from portal.errors import DomainError
from scheduler.admission import JobSpec, spec_validate
from scheduler.job_request import (
    ANNOTATION,
    annotation_key,
    manifest_annotations,
    manifest_error_path,
    manifest_number_annotations,
)
from scheduler.job_volumes import DEFAULT_SCRATCH_GIB
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

SHM_PATH = "/dev/shm"  # noqa: S108  # a mount point in the container, not a temp file
MAX_BACKOFF = 10
KUBERNETES_BACKOFF_DEFAULT = 6
SHELL = ["/bin/sh", "-c"]  # what the node runs a command with: exported commands use it

Finding = dict[str, str]

# The portal's annotations: what a Kubernetes Job has no field for (exports write them).
KNOWN_ANNOTATIONS = manifest_annotations()
NUMBER_FIELDS = manifest_number_annotations()  # the fields given as a whole-number annotation


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

WHY_SECURITY = "every job runs unprivileged, as the node's job user."
WHY_PREFERRED = "a preference, not a requirement: the pool's scorer places jobs."
WHY_PRIORITY = f"use the {ANNOTATION}priority annotation (low, normal, high, urgent)."
WHY_DNS = "jobs use the node's name resolution."
WHY_EPHEMERAL_STORAGE = "scratch space is not metered or limited per job."
WHY_QUEUE = "the portal's queue and the project's quota decide, not a Kueue LocalQueue."

REFUSE_NOT_SUPPORTED = "is not supported by the portal."
REFUSE_VOLUME = (
    "only the project's volumes (persistentVolumeClaim.claimName names one) and emptyDir are "
    "offered."
)
REFUSE_HOST_PATH = (
    "a job never mounts a host path: create a project volume (gpucloud volume create) and "
    "name it in persistentVolumeClaim.claimName."
)
REFUSE_CHECKPOINT_DIR = (
    "a host path is never accepted: checkpoints live on a volume; use the "
    f"{ANNOTATION}checkpoint annotation ('<volume>:<path inside it>')."
)

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
        self.values: dict[str, Any] = {}  # the spec's fields, as the steps read them

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
        """The pod's volumes by name, as {kind: its object}: emptyDir, or persistentVolumeClaim
        (the project's volume of that claim name); every other kind is refused, hostPath with
        why."""
        out: dict[str, dict[str, Any]] = {}
        for i, volume in enumerate(volumes):
            kinds = [k for k, v in volume.items() if k != "name" and v is not None]
            if kinds in (["emptyDir"], ["persistentVolumeClaim"]):
                out[str(volume.get("name"))] = {kinds[0]: volume[kinds[0]] or {}}
                continue
            for kind in kinds or ["(none)"]:
                why = REFUSE_HOST_PATH if kind == "hostPath" else REFUSE_VOLUME
                self.refuse(f"{path}[{i}].{kind}", why)
        return out


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


# ---------------------------------------------------------------------- the table of handled keys
def _given(value: Any) -> bool:
    return value is not None


def _truthy(value: Any) -> bool:
    return bool(value)


def _not_empty(value: Any) -> bool:
    return value not in ([], {}, False)


@dataclass(frozen=True)
class Rule:
    """How one key of a manifest object is handled, when `when(value)` holds (a None value
    never counts): honoured (a named step reads it), ignored or refused with `why`, or silent
    (accepted, meaningless, not reported)."""

    verdict: str
    why: str = ""
    when: Callable[[Any], bool] = _given


HONOURED = Rule("honoured")
SILENT = Rule("silent")


def ignored(why: str, when: Callable[[Any], bool] = _given) -> Rule:
    return Rule("ignored", why, when)


def refused(why: str, when: Callable[[Any], bool] = _given) -> Rule:
    return Rule("refused", why, when)


# The Job's own fields, in the order they are reported.
JOB_KEYS: dict[str, Rule] = {
    "completions": HONOURED,  # _job_fields
    "parallelism": HONOURED,
    "completionMode": HONOURED,
    "backoffLimit": HONOURED,
    "activeDeadlineSeconds": HONOURED,
    "template": HONOURED,
    "ttlSecondsAfterFinished": ignored(WHY_TTL),
    "suspend": ignored(WHY_SUSPEND, when=_truthy),
    "selector": ignored(WHY_SELECTOR),
    "manualSelector": ignored(WHY_SELECTOR),
    **{
        key: refused(REFUSE_NOT_SUPPORTED)
        for key in (
            "backoffLimitPerIndex",
            "maxFailedIndexes",
            "podFailurePolicy",
            "successPolicy",
            "podReplacementPolicy",
            "managedBy",
        )
    },
}
# The pod's fields; any other is refused unless empty.
POD_KEYS: dict[str, Rule] = {
    **dict.fromkeys(
        (
            "containers",  # _container
            "restartPolicy",  # the schema allows Never and OnFailure only
            "nodeSelector",  # _Reader.node_selector
            "affinity",  # _Reader.affinity
            "tolerations",  # _Reader.tolerations
            "volumes",  # _Reader.volumes
            "activeDeadlineSeconds",  # _job_fields
        ),
        HONOURED,
    ),
    **dict.fromkeys(
        ("hostNetwork", "hostIPC", "hostPID"),
        refused("jobs never share the node's network, IPC or process namespaces.", _truthy),
    ),
    "hostUsers": ignored(WHY_SECURITY, when=lambda value: value is not False),
    "initContainers": refused(
        "init containers are not supported: run the steps in the command.", _truthy
    ),
    "ephemeralContainers": refused(REFUSE_NOT_SUPPORTED, _truthy),
    **{key: ignored(why) for key, why in IGNORED_POD.items()},
}
# The container's fields; any other is refused unless empty.
CONTAINER_KEYS: dict[str, Rule] = {
    **dict.fromkeys(
        (
            "image",
            "command",  # _command
            "args",
            "workingDir",
            "env",  # _env
            "resources",  # _resources
            "volumeMounts",  # _volume_mounts
            "securityContext",  # _security
        ),
        HONOURED,
    ),
    **{key: ignored(why) if why else SILENT for key, why in IGNORED_CONTAINER.items()},
    "envFrom": refused(
        "environment from ConfigMaps and Secrets is not supported; give values.", _truthy
    ),
}
OTHER_POD_KEY = refused(REFUSE_NOT_SUPPORTED, when=_not_empty)
OTHER_CONTAINER_KEY = refused(REFUSE_NOT_SUPPORTED, when=lambda value: value not in ([], {}))


def walk(
    r: _Reader, obj: dict[str, Any], path: str, table: dict[str, Rule], other: Rule = SILENT
) -> None:
    """Report every key of `obj` as its rule says (an unlisted key as `other` says)."""
    for key, value in obj.items():
        rule = table.get(key, other)
        if value is None or not rule.when(value):
            continue
        if rule.verdict == "ignored":
            r.ignore(f"{path}.{key}", rule.why)
        elif rule.verdict == "refused":
            r.refuse(f"{path}.{key}", rule.why)


def walk_listed(r: _Reader, obj: dict[str, Any], path: str, table: dict[str, Rule]) -> None:
    """The same in the table's order, for its keys only (the schema refuses any other)."""
    walk(r, {key: obj.get(key) for key in table}, path, table)


# ---------------------------------------------------------------------- the steps
POD = "spec.template.spec"
CONTAINER = f"{POD}.containers[0]"


def _job_meta(r: _Reader, doc: dict[str, Any]) -> None:
    """status, metadata; the job's name (an annotation may give one Kubernetes cannot)."""
    if doc.get("status") is not None:
        r.ignore("status", WHY_CLUSTER_META)
    meta = doc.get("metadata") or {}
    r.metadata(meta, "metadata", top=True)
    name = meta.get("name") or meta.get("generateName")
    if not isinstance(name, str) or not name.strip():
        r.refuse("metadata.name", "is required: it names the job.")
        name = "job"
    annotations = meta.get("annotations") or {}
    r.values["name"] = str(annotations.get(f"{ANNOTATION}name") or name).strip()[:100]
    template = (doc.get("spec") or {}).get("template") or {}
    r.metadata(template.get("metadata") or {}, "spec.template.metadata", top=False)


def _job_fields(r: _Reader, spec: dict[str, Any], pod: dict[str, Any]) -> None:
    """completions (an Indexed Job is an array), backoffLimit, activeDeadlineSeconds."""
    shard_count = 1
    completions, parallelism = spec.get("completions"), spec.get("parallelism")
    if spec.get("completionMode") == "Indexed":
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
    r.values |= {"shard_count": shard_count, "max_restarts": backoff, "time_limit_s": time_limit}
    walk_listed(r, spec, "spec", JOB_KEYS)


def _pod_fields(r: _Reader, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's keys, its node choice; returns its volumes by name."""
    walk(r, pod, POD, POD_KEYS, OTHER_POD_KEY)
    if pod.get("nodeSelector"):
        r.node_selector(pod["nodeSelector"], f"{POD}.nodeSelector")
    if pod.get("affinity"):
        r.affinity(pod["affinity"], f"{POD}.affinity")
    if pod.get("tolerations"):
        r.tolerations(pod["tolerations"], f"{POD}.tolerations")
    return r.volumes(pod.get("volumes") or [], f"{POD}.volumes")


def _container(r: _Reader, pod: dict[str, Any]) -> dict[str, Any]:
    """The one container (others refused), its keys walked; {} when there is none."""
    containers = pod.get("containers") or []
    for i in range(1, len(containers)):
        r.refuse(
            f"{POD}.containers[{i}]", "only one container is supported: run helpers inside it."
        )
    if not containers:
        r.refuse(f"{POD}.containers", "give one container.")
        return {}
    c: dict[str, Any] = containers[0]
    walk(r, c, CONTAINER, CONTAINER_KEYS, OTHER_CONTAINER_KEY)
    return c


def _security(r: _Reader, c: dict[str, Any]) -> None:
    """Nothing privileged; every other security setting is the node's own."""
    for key, value in (c.get("securityContext") or {}).items():
        if value is None:
            continue
        where = f"{CONTAINER}.securityContext.{key}"
        if key == "privileged" and value:
            r.refuse(where, "privileged containers are not allowed.")
        elif key == "allowPrivilegeEscalation" and value:
            r.refuse(where, "privilege escalation is not allowed.")
        elif key == "capabilities" and (value.get("add") or []):
            r.refuse(f"{where}.add", "no capabilities can be added.")
        elif key not in ("privileged", "allowPrivilegeEscalation"):
            r.ignore(where, WHY_SECURITY)


def _command(r: _Reader, c: dict[str, Any], *, given: bool) -> None:
    """command + args: `sh -c TEXT` is TEXT, anything else the argv joined for a shell."""
    argv = [str(a) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
    if not argv and given:
        r.refuse(
            f"{CONTAINER}.command", "give the command to run (the image's entrypoint is not read)."
        )
    command = argv[2] if len(argv) == 3 and argv[:2] == SHELL else shlex.join(argv)
    r.values |= {
        "command": command,
        "image": str(c.get("image") or "")[:300],
        "working_dir": str(c.get("workingDir") or ""),
    }


def _env(r: _Reader, c: dict[str, Any]) -> None:
    """Plain values only: values from Secrets, ConfigMaps or fields are refused."""
    env: dict[str, str] = {}
    for i, item in enumerate(c.get("env") or []):
        if item.get("valueFrom") is not None:
            r.refuse(
                f"{CONTAINER}.env[{i}].valueFrom",
                f"{item.get('name')}: values from Secrets, ConfigMaps or fields are not "
                "supported; give a value.",
            )
            continue
        env[str(item.get("name", ""))] = str(item.get("value") or "")
    r.values["env"] = env


def _gpu_count(r: _Reader, limits: dict[str, Any], requests: dict[str, Any]) -> None:
    """nvidia.com/gpu (required, whole, requests equal to limits) and the GPU model limit."""
    rpath = f"{CONTAINER}.resources"
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
    r.values["gpus"] = gpus
    if limits.get(GPU_MODEL) is not None:
        r.allow_models(f"{rpath}.limits.{GPU_MODEL}", [str(limits[GPU_MODEL])])
    if requests.get(GPU_MODEL) is not None and requests.get(GPU_MODEL) != limits.get(GPU_MODEL):
        r.allow_models(f"{rpath}.requests.{GPU_MODEL}", [str(requests[GPU_MODEL])])


def _cpu_memory(r: _Reader, limits: dict[str, Any], requests: dict[str, Any]) -> None:
    """cpu and memory: the node reserves, and holds the job to, the limit (else the request)."""
    rpath = f"{CONTAINER}.resources"
    for kind, parse, spec_field in (
        ("cpu", cpu_milli, "cpu_milli"),
        ("memory", memory_mib, "memory_mib"),
    ):
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
        r.values[spec_field] = amounts.get("limits", amounts.get("requests", 0))


def _resources(r: _Reader, c: dict[str, Any]) -> None:
    """limits and requests: GPUs, the GPU model, cpu, memory; other resources are not offered."""
    resources = c.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    rpath = f"{CONTAINER}.resources"
    for key in resources:
        if key not in ("limits", "requests") and resources[key] is not None:
            r.refuse(f"{rpath}.{key}", REFUSE_NOT_SUPPORTED)
    _gpu_count(r, limits, requests)
    _cpu_memory(r, limits, requests)
    for side, values in (("requests", requests), ("limits", limits)):
        for key in values:
            if key in (GPU, GPU_MODEL, "cpu", "memory"):
                continue
            if key == "ephemeral-storage":
                r.ignore(f"{rpath}.{side}.{key}", WHY_EPHEMERAL_STORAGE)
            else:
                r.refuse(f"{rpath}.{side}.{key}", f"the resource '{key}' is not offered.")


def _shm_size(r: _Reader, vol_name: str, empty_dir: dict[str, Any]) -> int:
    """A memory-backed emptyDir's size in MiB: its sizeLimit, else the memory limit."""
    size = empty_dir.get("sizeLimit")
    where = f"{POD}.volumes.{vol_name}.emptyDir.sizeLimit"
    if size is not None:
        try:
            return memory_mib(size)
        except QuantityError as exc:
            r.refuse(where, f"{exc}.")
            return 0
    if r.values["memory_mib"]:
        return int(r.values["memory_mib"])  # Kubernetes counts it against the memory limit
    r.refuse(where, "give a sizeLimit (or a memory limit): shared memory needs a size.")
    return 0


def _scratch_gib(r: _Reader, vol_name: str, empty_dir: dict[str, Any]) -> int:
    """A disk emptyDir's size in GiB (rounded up): its sizeLimit, else the default scratch."""
    size = empty_dir.get("sizeLimit")
    if size is None:
        return DEFAULT_SCRATCH_GIB
    try:
        return max(1, -(-memory_mib(size) // 1024))
    except QuantityError as exc:
        r.refuse(f"{POD}.volumes.{vol_name}.emptyDir.sizeLimit", f"{exc}.")
        return DEFAULT_SCRATCH_GIB


def _volume_mount(
    r: _Reader, where: str, mount: dict[str, Any], volume: dict[str, Any], vol_name: str
) -> dict[str, Any] | None:
    """One mount as a request's volume (None: shared memory, or refused)."""
    mount_path = str(mount.get("mountPath"))
    read_only = bool(mount.get("readOnly"))
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]
        name = str(claim.get("claimName") or "")
        if not name:
            r.refuse(f"{POD}.volumes.{vol_name}.persistentVolumeClaim.claimName", "name a volume.")
            return None
        return {
            "name": name,
            "path": mount_path,
            "read_only": read_only or bool(claim.get("readOnly")),
        }
    empty_dir = volume["emptyDir"]
    if empty_dir.get("medium") == "Memory":
        if mount_path.rstrip("/") != SHM_PATH:
            r.refuse(
                f"{where}.mountPath",
                f"'{mount_path}': a memory-backed volume is offered at {SHM_PATH} only.",
            )
        else:
            r.values["shm_mib"] = _shm_size(r, vol_name, empty_dir)
        return None
    size = _scratch_gib(r, vol_name, empty_dir)
    return {
        "name": vol_name, "path": mount_path, "read_only": read_only, "kind": "scratch",
        "size_gib": size,
    }  # fmt: skip


def _volume_mounts(r: _Reader, c: dict[str, Any], pod_volumes: dict[str, dict[str, Any]]) -> None:
    """The project's volumes (claims), scratch (a disk emptyDir) and shared memory (a memory
    emptyDir at /dev/shm, shm_mib)."""
    r.values["shm_mib"] = 0
    volumes: list[dict[str, Any]] = []
    mounted: set[str] = set()
    for i, mount in enumerate(c.get("volumeMounts") or []):
        where = f"{CONTAINER}.volumeMounts[{i}]"
        vol_name = str(mount.get("name"))
        mounted.add(vol_name)
        for key, value in mount.items():
            if key not in ("name", "mountPath", "readOnly") and value not in (None, ""):
                r.refuse(f"{where}.{key}", REFUSE_NOT_SUPPORTED)
        if vol_name not in pod_volumes:
            if not any(f["field"].startswith(f"{POD}.volumes") for f in r.refused):
                r.refuse(f"{where}.name", f"no volume named '{vol_name}' in the pod.")
            continue
        if (entry := _volume_mount(r, where, mount, pod_volumes[vol_name], vol_name)) is not None:
            volumes.append(entry)
    for vol_name in pod_volumes:
        if vol_name not in mounted:
            r.ignore(f"{POD}.volumes.{vol_name}", "not mounted by the container.")
    r.values["volumes"] = tuple(volumes)


def _gpu_models(r: _Reader) -> None:
    """Every GPU constraint holds (limits, nodeSelector, affinity), each allows any of its
    models: one model left is gpu_model, several are gpu_models."""
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
            ordered = [m for m in r.catalog if m.name in allowed]
            if len(ordered) == 1:
                gpu_model = ordered[0]
            else:
                gpu_models = tuple(m.name for m in ordered)
    r.values |= {"gpu_model": gpu_model, "gpu_models": gpu_models}


def _annotations(r: _Reader, annotations: dict[str, Any]) -> None:
    """The portal's own annotations: what a Kubernetes Job has no field for."""
    priority_name = str(annotations.get(f"{ANNOTATION}priority", "normal")).upper()
    if priority_name not in PriorityClass.names:
        r.refuse(f"metadata.annotations.{ANNOTATION}priority", "use low, normal, high or urgent.")
        priority_name = "NORMAL"
    numbers: dict[str, int | None] = {}
    for field in NUMBER_FIELDS:
        key = str(annotation_key(field.manifest_in))
        value = annotations.get(key)
        numbers[field.name] = None
        if value is not None:
            if str(value).isdigit() and len(str(value)) < 10:
                numbers[field.name] = int(str(value))
            else:
                r.refuse(f"metadata.annotations.{key}", "a whole number.")
    for key in annotations:
        if key == f"{ANNOTATION}checkpoint-dir":
            r.refuse(f"metadata.annotations.{key}", REFUSE_CHECKPOINT_DIR)
        elif (
            str(key).startswith(ANNOTATION) and str(key)[len(ANNOTATION) :] not in KNOWN_ANNOTATIONS
        ):
            r.refuse(
                f"metadata.annotations.{key}",
                f"unknown; the {ANNOTATION} annotations are " + ", ".join(KNOWN_ANNOTATIONS) + ".",
            )
    precisions = str(annotations.get(f"{ANNOTATION}precisions") or "")
    nodes = numbers["nodes"]
    r.values |= {
        **numbers,
        "gpu_milli": numbers["gpu_milli"] or 1000,
        "gpu_memory_mib": numbers["gpu_memory_mib"] or 0,
        "min_gpu_memory_gb": numbers["min_gpu_memory_gb"] or 0,
        "gpus_per_node": r.values["gpus"] if nodes is not None else None,
        "priority": PriorityClass[priority_name].value,
        "preemptible": str(annotations.get(f"{ANNOTATION}preemptible", "false")).lower() == "true",
        "precisions": tuple(p for p in precisions.replace(" ", "").split(",") if p),
        "checkpoint": str(annotations.get(f"{ANNOTATION}checkpoint") or ""),
    }


def manifest_read(doc: dict[str, Any], catalog: list[GpuModel]) -> _Reader:
    """Every step over a schema-valid Job: the spec's fields in `values`, what was ignored
    and refused (no database: the catalog is given)."""
    r = _Reader(catalog)
    spec = doc.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    _job_meta(r, doc)
    _job_fields(r, spec, pod)
    pod_volumes = _pod_fields(r, pod)
    c = _container(r, pod)
    _security(r, c)
    _command(r, c, given=bool(pod.get("containers")))
    _env(r, c)
    _resources(r, c)
    _volume_mounts(r, c, pod_volumes)
    _gpu_models(r)
    _annotations(r, (doc.get("metadata") or {}).get("annotations") or {})
    return r


def parse_manifest(raw: str | bytes) -> ManifestImport:
    """The job a Kubernetes Job manifest asks for, the namespace it names, what was ignored;
    every refusal is answered at once."""
    doc = load_manifest(raw)
    r = manifest_read(doc, list(GpuModel.objects.filter(is_active=True)))
    if r.refused:
        raise ManifestRefused(r.refused)
    job_spec = JobSpec(**r.values, source=Job.Source.MANIFEST, manifest_ignored=tuple(r.ignored))
    try:
        job_spec = spec_validate(job_spec)
    except DomainError as exc:
        raise ManifestRefused(
            [{"field": manifest_error_path(exc.field, CONTAINER), "why": exc.message}]
        ) from None
    namespace = (doc.get("metadata") or {}).get("namespace")
    return ManifestImport(job_spec, str(namespace) if namespace else None, r.ignored)
