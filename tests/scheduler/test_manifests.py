"""Kubernetes Job manifests, field by field: a corpus in the styles of the product brief, the
Kubernetes, Kueue and university-cluster docs, each field honoured, ignored or refused as
docs/manifests.md says; unsafe YAML and oversized documents refused; any job exported as a
batch/v1 Job that the same schema accepts and that imports to the same request."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from scheduler.cycle import run_cycle
from scheduler.estimates import job_dry_run
from scheduler.manifests import ManifestRefused, job_manifest, parse_manifest
from scheduler.manifests.fields import cpu_milli, memory_mib, models_named, product_label
from scheduler.manifests.schema import MAX_MANIFEST_BYTES, SCHEMA_VERSION, schema_errors
from scheduler.models import Allocation, GpuModel, Job, JobState, QuotaModelLimit

pytestmark = pytest.mark.django_db

CORPUS = Path(__file__).parent / "manifests"
POD = "spec.template.spec"
C0 = f"{POD}.containers[0]"


@pytest.fixture
def lab(team, fleet):
    from storage.models import Volume

    # the corpus's checkpoint volume (l40s_selector_annotations.yaml)
    Volume.objects.create(project=team["a"], name="sdxl", kind="shared", size_gib=10)
    return {**team, **fleet}


def corpus(name: str) -> str:
    return (CORPUS / name).read_text()


def post(api, user, text: str | bytes, **query: str):
    path = "/api/v1/jobs/manifest" + (
        "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
    )
    return api(user).generic("POST", path, text, content_type="application/yaml")


def fields_of(findings: list[dict[str, str]]) -> list[str]:
    return sorted(f["field"] for f in findings)


ASKS = (
    "name",
    "command",
    "image",
    "env",
    "working_dir",
    "volumes",
    "checkpoint",
    "gpu_count",  # a gang's `gpus` means nothing: nodes × gpus_per_node
    "gpu_milli",
    "gpu_memory_mib",
    "gpu_model_id",
    "gpu_models",
    "min_gpu_memory_gb",
    "precisions",
    "nodes",
    "gpus_per_node",
    "cpu_milli",
    "memory_mib",
    "shm_mib",
    "priority",
    "preemptible",
    "runtime_estimate_s",
    "time_limit_s",
    "max_restarts",
    "elastic_min",
    "elastic_max",
    "shard_count",
)


def ask(job: Job) -> dict[str, Any]:
    return {f: getattr(job, f) for f in ASKS}


# ---------------------------------------------------------------- honoured and ignored


def test_the_product_briefs_a100_manifest_means_any_a100(lab, api):
    resp = post(api, lab["member"], corpus("brief_a100.yaml"))
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["ignored"] == [] and body["gpu_model"] is None
    assert body["gpu_models"] == ["A100-80GB", "A100-40GB"]
    job = Job.objects.get(pk=body["id"])
    assert (job.gpus, job.command, job.image, job.source) == (
        4,
        "python finetune.py --model llama-7b",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "manifest",
    )
    assert job.max_restarts == 6  # Kubernetes' default backoffLimit
    # The fleet has H100s and L4s free, no A100: the planner's filter keeps it off them.
    run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and not job.allocations.exists()
    assert job.pending_reason == "no_matching_gpu"
    assert "A100-40GB or A100-80GB" in job.pending_message


def test_university_manifest_shm_affinity_requests_tolerations(lab, api):
    resp = post(api, lab["member"], corpus("university_ddp_shm_affinity.yaml"))
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert fields_of(body["ignored"]) == [
        "metadata.labels",
        "spec.template.metadata.labels",
        f"{POD}.tolerations[0]",
        "spec.ttlSecondsAfterFinished",
    ]
    job = Job.objects.get(pk=body["id"])
    assert job.gpu_model is None and job.gpu_models == ["A100-80GB", "H100-80GB-SXM"]
    assert (job.gpus, job.cpu_milli, job.memory_mib, job.shm_mib) == (2, 16_000, 65_536, 8192)
    assert (job.time_limit_s, job.max_restarts, job.working_dir) == (86400, 2, "/workspace")
    assert job.command == "torchrun --nproc_per_node=2 train.py --epochs 90 --batch-size 256"
    assert job.env == {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "8"}
    assert job.manifest_ignored == body["ignored"]
    # Any of the two models: the fleet's H100s take it, its L4s never do.
    assert run_cycle().placed == [job.pk]
    models = set(Allocation.objects.filter(job=job).values_list("gpu_model__name", flat=True))
    assert models == {"H100-80GB-SXM"}


def test_kueue_indexed_job_is_an_array_on_t4(lab, api):
    resp = post(api, lab["member"], corpus("kueue_indexed_t4.yaml"))
    assert resp.status_code == 201, resp.content
    shards = resp.json()
    assert isinstance(shards, list) and len(shards) == 3
    assert [s["shard_index"] for s in shards] == [0, 1, 2]
    ignored = shards[0]["ignored"]
    assert fields_of(ignored) == ["metadata.labels", "spec.suspend"]
    assert "Kueue" in next(i["why"] for i in ignored if i["field"] == "metadata.labels")
    job = Job.objects.get(pk=shards[0]["id"])
    assert job.name == "sample-job-[0]" and job.shard_count == 3
    assert job.gpu_model.name == "T4" and job.gpu_models == []
    assert (job.cpu_milli, job.memory_mib) == (1000, 200)
    # `/bin/sh -c X` is how the node runs a command: the job's command is X itself.
    assert job.command == "python shard.py --index $JOB_COMPLETION_INDEX"


def test_l40s_selector_annotations_quantities(lab, api):
    resp = post(api, lab["member"], corpus("l40s_selector_annotations.yaml"))
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert fields_of(body["ignored"]) == [
        "metadata.annotations.team.example.com/owner",
        f"{C0}.imagePullPolicy",
        f"{POD}.runtimeClassName",
    ]
    job = Job.objects.get(pk=body["id"])
    assert job.gpu_model.name == "L40S"
    assert (job.cpu_milli, job.memory_mib, job.max_restarts) == (500, 954, 0)
    assert (job.priority, job.preemptible, job.runtime_estimate_s) == (2, True, 1800)
    assert job.checkpoint == "sdxl:checkpoints" and job.time_limit_s is None
    assert job.volumes == [{"name": "sdxl", "path": "/data/sdxl", "read_only": False}]


def test_the_job_page_says_what_was_ignored_and_links_the_manifest(lab, api, client):
    body = post(api, lab["member"], corpus("university_ddp_shm_affinity.yaml")).json()
    client.force_login(lab["member"])
    page = client.get(f"/jobs/{body['id']}/").content.decode()
    assert 'data-testid="manifest-ignored"' in page
    assert "spec.ttlSecondsAfterFinished" in page and "garbage-collected" in page
    assert f"/jobs/{body['id']}/manifest/" in page
    # A job from the JSON API has nothing ignored: no note.
    other = api(lab["member"]).post(
        "/api/v1/jobs", {"project": "alpha", "name": "plain", "command": "true"}, format="json"
    )
    plain = client.get(f"/jobs/{other.json()['id']}/").content.decode()
    assert 'data-testid="manifest-ignored"' not in plain


# ---------------------------------------------------------------- refused


def test_every_refused_field_is_named_at_once(lab, api):
    resp = post(api, lab["member"], corpus("refused_everything.yaml"))
    assert resp.status_code == 400, resp.content
    refused = resp.json()["refused"]
    assert fields_of(refused) == sorted(
        [
            "spec.backoffLimit",
            f"{POD}.hostNetwork",
            f"{POD}.hostIPC",
            f"{POD}.initContainers",
            f"{POD}.tolerations[0]",
            f"{POD}.containers[1]",
            f"{POD}.volumes[1].hostPath",
            f"{C0}.securityContext.privileged",
            f"{C0}.env[0].valueFrom",
        ]
    )
    why = {f["field"]: f["why"] for f in refused}
    assert "never mounts a host path" in why[f"{POD}.volumes[1].hostPath"]
    assert "at most 10" in why["spec.backoffLimit"]
    assert "WANDB_API_KEY" in why[f"{C0}.env[0].valueFrom"]
    assert Job.objects.count() == 0


def test_a_cluster_node_label_is_refused_by_name(lab, api):
    resp = post(api, lab["member"], corpus("k8s_docs_accelerator_label.yaml"))
    assert resp.status_code == 400
    assert fields_of(resp.json()["refused"]) == [f"{POD}.nodeSelector.accelerator"]


def _brief(**patch: Any) -> dict[str, Any]:
    doc = yaml.safe_load(corpus("brief_a100.yaml"))
    for path, value in patch.items():
        node = doc
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[keys[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("patch", "field", "why"),
    [
        ({"apiVersion": "batch/v2alpha9"}, "apiVersion", "only batch/v1"),
        ({"kind": "CronJob"}, "kind", "only Job"),
        ({"spec__completions": 4}, "spec.completions", "completionMode: Indexed"),
        ({"spec__parallelism": 4}, "spec.parallelism", "work queue"),
        ({"spec__bogus": 1}, "spec.bogus", "not a field"),
        ({"spec__backoffLimit": "two"}, "spec.backoffLimit", "Kubernetes schema"),
        ({"spec__activeDeadlineSeconds": 10}, "spec.activeDeadlineSeconds", "1 minute"),
        (
            {
                "spec__template__spec__containers__0__resources__limits__nvidia.com/gpu.model": "B300"
            },
            f"{C0}.resources.limits.nvidia.com/gpu.model",
            "unknown GPU model 'B300'",
        ),
        (
            {"spec__template__spec__containers__0__resources__limits__memory": "lots"},
            f"{C0}.resources.limits.memory",
            "not a quantity",
        ),
        (
            {"spec__template__spec__nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L40S"}},
            f"{POD}.nodeSelector.nvidia.com/gpu.product",
            "no catalog GPU model satisfies",
        ),
        (
            {"spec__template__spec__hostPID": True},
            f"{POD}.hostPID",
            "process namespaces",
        ),
    ],
)
def test_refused_fields_say_where_and_why(lab, api, patch, field, why):
    resp = post(api, lab["member"], yaml.safe_dump(_brief(**patch)))
    assert resp.status_code == 400, resp.content
    refused = resp.json()["refused"]
    assert field in fields_of(refused), refused
    if "satisfies" in why:  # a conflict names both sides
        assert f"{C0}.resources.limits.nvidia.com/gpu.model" in fields_of(refused)
    assert why in next(f["why"] for f in refused if f["field"] == field)
    assert Job.objects.count() == 0


def test_affinity_any_of_intersects_with_the_family(lab):
    doc = _brief()
    doc["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "nvidia.com/gpu.product",
                                "operator": "In",
                                "values": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"],
                            }
                        ]
                    }
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                    },
                }
            ],
        }
    }
    imported = parse_manifest(yaml.safe_dump(doc))
    assert imported.spec.gpu_model is not None and imported.spec.gpu_model.name == "A100-80GB"
    assert fields_of(imported.ignored) == [
        f"{POD}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    ]
    expr = doc["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"][0]
    expr["operator"] = "NotIn"
    with pytest.raises(ManifestRefused) as refused:
        parse_manifest(yaml.safe_dump(doc))
    assert "only In" in refused.value.refused[0]["why"]


def test_shared_memory_needs_a_size_and_dev_shm(lab):
    doc = _brief()
    pod = doc["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    with pytest.raises(ManifestRefused) as no_size:
        parse_manifest(yaml.safe_dump(doc))
    assert no_size.value.refused[0]["field"] == f"{POD}.volumes.dshm.emptyDir.sizeLimit"
    pod["containers"][0]["resources"]["limits"]["memory"] = "24Gi"
    assert parse_manifest(yaml.safe_dump(doc)).spec.shm_mib == 24 * 1024  # the memory limit
    pod["containers"][0]["volumeMounts"][0]["mountPath"] = "/shm"
    with pytest.raises(ManifestRefused) as elsewhere:
        parse_manifest(yaml.safe_dump(doc))
    assert elsewhere.value.refused[0]["field"] == f"{C0}.volumeMounts[0].mountPath"
    # A disk emptyDir is a scratch volume of its sizeLimit (10 GiB without one).
    pod["volumes"] = [{"name": "scratch", "emptyDir": {"sizeLimit": "1500Mi"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    imported = parse_manifest(yaml.safe_dump(doc))
    assert imported.spec.shm_mib == 0 and imported.ignored == []
    assert imported.spec.volumes == (
        {"name": "scratch", "path": "/scratch", "read_only": False, "kind": "scratch",
         "size_gib": 2},
    )  # fmt: skip


def test_a_claim_is_the_projects_volume_and_no_host_path_is_taken(lab, api):
    doc = _brief()
    pod = doc["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "sdxl"}}]
    pod["containers"][0]["volumeMounts"] = [{"name": "d", "mountPath": "/in", "readOnly": True}]
    pod["containers"][0]["workingDir"] = "/in/sub"
    assert parse_manifest(yaml.safe_dump(doc)).spec.volumes == (
        {"name": "sdxl", "path": "/in", "read_only": True},
    )
    for where, bad, field in [
        ("workingDir", "/root", f"{C0}.workingDir"),
        ("workingDir", "/srv/portal/.venv/lib/python3.12/site-packages", f"{C0}.workingDir"),
    ]:
        pod["containers"][0][where] = bad
        resp = post(api, lab["member"], yaml.safe_dump(doc))
        assert resp.status_code == 400 and fields_of(resp.json()["refused"]) == [field], bad
    pod["containers"][0]["workingDir"] = "/in"
    pod["volumes"] = [{"name": "d", "hostPath": {"path": "/root"}}]
    resp = post(api, lab["member"], yaml.safe_dump(doc))
    assert resp.status_code == 400
    (finding,) = resp.json()["refused"]
    assert finding["field"] == f"{POD}.volumes[0].hostPath" and "host path" in finding["why"]
    pod["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "theirs"}}]
    resp = post(api, lab["member"], yaml.safe_dump(doc))  # no such volume in alpha
    assert resp.status_code == 400 and "volumes" in str(resp.json()), resp.content
    doc["metadata"]["annotations"] = {"gpucloud.example/checkpoint-dir": "/root"}
    pod["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "sdxl"}}]
    resp = post(api, lab["member"], yaml.safe_dump(doc))
    assert resp.status_code == 400
    (finding,) = resp.json()["refused"]
    assert finding["field"] == "metadata.annotations.gpucloud.example/checkpoint-dir"
    assert Job.objects.count() == 0


# ---------------------------------------------------------------- unsafe or oversized input

ALIAS_BOMB = """\
apiVersion: batch/v1
kind: Job
metadata: {name: bomb, namespace: alpha}
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_the_alias_bomb_is_refused_before_it_expands(lab, api):
    assert len(ALIAS_BOMB) < 600
    tracemalloc.start()
    try:
        with pytest.raises(ManifestRefused) as refused:
            parse_manifest(ALIAS_BOMB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.refused == [
        {"field": "manifest", "why": "YAML anchors (&a) are not accepted; write the value out."}
    ]
    assert peak < 2 * 1024 * 1024  # nothing was composed: 9**9 strings would be gigabytes
    resp = post(api, lab["member"], ALIAS_BOMB)
    assert resp.status_code == 400 and "anchors" in resp.json()["detail"]


def test_aliases_without_anchors_and_deep_nesting_are_refused(lab):
    with pytest.raises(ManifestRefused) as alias:
        parse_manifest("a: *nowhere\n")
    assert "aliases (*nowhere) are not accepted" in alias.value.refused[0]["why"]
    with pytest.raises(ManifestRefused) as deep:
        parse_manifest("a: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested deeper" in deep.value.refused[0]["why"]


def test_the_size_cap_is_a_413(lab, api):
    text = corpus("brief_a100.yaml")
    padding = "#" + "x" * 1000 + "\n"
    big = text + padding * (MAX_MANIFEST_BYTES // len(padding) + 1)
    assert len(big) > MAX_MANIFEST_BYTES
    resp = post(api, lab["member"], big)
    assert resp.status_code == 413
    assert resp.json()["refused"][0]["why"].startswith("is larger than 256 KiB")
    # Within the cap, the same manifest with comments is fine.
    fits = text + padding * 10
    assert post(api, lab["member"], fits).status_code == 201


# ---------------------------------------------------------------- export and round trip


def _round_trip(job: Job, api, user) -> Job:
    doc = job_manifest(job)
    assert schema_errors(doc) == []
    assert kubernetes_validate.validate(doc, SCHEMA_VERSION, strict=True)
    resp = post(api, user, yaml.safe_dump(doc))
    assert resp.status_code == 201, resp.content
    body = resp.json()
    first = body[0] if isinstance(body, list) else body
    assert first["ignored"] == []
    return Job.objects.get(pk=first["id"])


@pytest.mark.parametrize(
    "name",
    [
        "brief_a100.yaml",
        "university_ddp_shm_affinity.yaml",
        "kueue_indexed_t4.yaml",
        "l40s_selector_annotations.yaml",
    ],
)
def test_export_round_trips_the_corpus(lab, api, name):
    body = post(api, lab["member"], corpus(name)).json()
    job = Job.objects.get(pk=(body[0] if isinstance(body, list) else body)["id"])
    again = _round_trip(job, api, lab["member"])
    assert ask(again) == ask(job)


def test_export_round_trips_what_kubernetes_has_no_field_for(lab, api):
    cases = [
        {"name": "Gang Job #1", "nodes": 2, "gpus_per_node": 2, "precisions": ["bf16"]},
        {"name": "half", "gpu_milli": 500, "gpu_memory_mib": 8000, "gpu_model": "L4"},
        {"name": "elastic", "gpus": 2, "elastic_min": 1, "elastic_max": 4, "min_gpu_memory_gb": 40},
    ]
    for fields in cases:
        resp = api(lab["member"]).post(
            "/api/v1/jobs",
            {"project": "alpha", "command": "python 'a b.py' && echo done", **fields},
            format="json",
        )
        assert resp.status_code == 201, resp.content
        job = Job.objects.get(pk=resp.json()["id"])
        again = _round_trip(job, api, lab["member"])
        assert ask(again) == ask(job), fields


def test_export_endpoint_and_page_download(lab, api, client):
    body = post(api, lab["member"], corpus("university_ddp_shm_affinity.yaml")).json()
    resp = api(lab["viewer"]).get(
        f"/api/v1/jobs/{body['id']}/manifest", HTTP_ACCEPT="application/yaml"
    )
    assert resp.status_code == 200 and resp["Content-Type"].startswith("application/yaml")
    doc = yaml.safe_load(resp.content)
    assert doc["apiVersion"] == "batch/v1" and doc["kind"] == "Job"
    assert doc["spec"]["template"]["spec"]["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    ]
    as_json = api(lab["viewer"]).get(
        f"/api/v1/jobs/{body['id']}/manifest", HTTP_ACCEPT="application/json"
    )
    assert as_json.json() == doc
    assert api(lab["outsider"]).get(f"/api/v1/jobs/{body['id']}/manifest").status_code == 404
    client.force_login(lab["viewer"])
    page = client.get(f"/jobs/{body['id']}/manifest/")
    assert page.status_code == 200 and "attachment" in page["Content-Disposition"]
    assert yaml.safe_load(page.content) == doc


# ---------------------------------------------------------------- the model set in the core


def test_a_model_set_through_admission_and_the_dry_run(lab):
    imported = parse_manifest(corpus("university_ddp_shm_affinity.yaml"))
    dry = job_dry_run(project=lab["a"], spec=imported.spec)
    assert dry.admitted and dry.would_start_now
    # The A100 (list 2.20) and the H100 (3.50): it lands on an H100, quoted at that price.
    assert dry.cost_per_hour == 2 * GpuModel.objects.get(name="H100-80GB-SXM").price_per_gpu_hour
    # A project limited to 1 GPU of each allowed model cannot take 2 of either.
    quota = lab["a"].quota
    quota.allow_borrowing = False
    quota.save()
    for name in ("A100-80GB", "H100-80GB-SXM"):
        QuotaModelLimit.objects.create(
            quota=quota, gpu_model=GpuModel.objects.get(name=name), max_gpus=1
        )
    refused = job_dry_run(project=lab["a"], spec=imported.spec)
    assert not refused.admitted and "A100-80GB or H100-80GB-SXM" in refused.admission_reason


def test_quantities_and_names():
    assert [cpu_milli(v) for v in ("500m", "2", "0.5", 1, "1.5")] == [500, 2000, 500, 1000, 1500]
    assert [memory_mib(v) for v in ("16Gi", "512Mi", "1G", "1Ti", "1e9", 1048576)] == [
        16384,
        512,
        954,
        1024 * 1024,
        954,
        1,
    ]


def test_gpu_names_map_to_catalog_models(fleet):
    catalog = list(GpuModel.objects.filter(is_active=True))

    def names(value: str) -> list[str]:
        return sorted(m.name for m in models_named(value, catalog))

    assert names("A100") == ["A100-40GB", "A100-80GB"]
    assert names("a100-80gb") == ["A100-80GB"]
    assert names("NVIDIA-A100-SXM4-80GB") == ["A100-80GB"]
    assert names("NVIDIA-H100-80GB-HBM3") == ["H100-80GB-SXM"]
    assert names("NVIDIA-L40S") == ["L40S"]
    assert names("Tesla-T4") == ["T4"]
    assert names("A10") == ["A10"]
    assert names("B300") == []
    # Exported product labels name each model back, even one without NVML names.
    for model in catalog:
        assert models_named(product_label(model), catalog) == [model]
    model = catalog[0]
    model.nvml_names = []
    assert product_label(model) == model.name
    assert models_named(product_label(model), catalog) == [model]


def test_control_characters_are_a_400_not_a_500(lab, api):
    resp = post(api, lab["member"], b"\x00apiVersion: batch/v1\n")
    assert resp.status_code == 400
    assert "not valid YAML" in resp.json()["refused"][0]["why"]
