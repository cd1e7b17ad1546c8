"""Jobs end to end at the service and API level: admission, the cycle, agent reports."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.models import Membership, Role
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Gpu, Job, JobEvent, JobState, QuotaModelLimit

pytestmark = pytest.mark.django_db


@pytest.fixture
def lab(team, fleet):
    return {**team, **fleet}


def agent(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def submit(api, user, **fields):
    body = {"project": "alpha", "name": "train", "command": "python train.py", **fields}
    resp = api(user).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def node_of(job_id: int) -> str:
    return Allocation.objects.filter(job_id=job_id, ended_at__isnull=True).first().node.name


def test_submit_schedule_run_succeed(lab, api):
    job = submit(api, lab["member"], gpus=2, gpu_model="H100-80GB-SXM")
    assert job["state"] == "queued"
    assert run_cycle().placed == [job["id"]]
    node = node_of(job["id"])
    client = agent(lab["tokens"][node])
    assignments = client.get("/api/agent/v1/assignments").json()["assignments"]
    assert [a["job_id"] for a in assignments] == [job["id"]]
    a = assignments[0]
    assert (
        a["action"] == "run" and len(a["gpu_uuids"]) == 2 and a["env"]["JOB_ID"] == str(job["id"])
    )
    assert (
        client.post(
            f"/api/agent/v1/jobs/{job['id']}/started", {"attempt": 1, "pid": 42}, format="json"
        ).json()["state"]
        == "running"
    )
    assert (
        client.post(
            f"/api/agent/v1/jobs/{job['id']}/logs",
            {"attempt": 1, "seq": 0, "stream": "stdout", "text": "step 1\n"},
            format="json",
        ).status_code
        == 201
    )
    assert (
        client.post(
            f"/api/agent/v1/jobs/{job['id']}/logs",
            {"attempt": 1, "seq": 0, "stream": "stdout", "text": "step 1\n"},
            format="json",
        ).status_code
        == 200
    )
    resp = client.post(
        f"/api/agent/v1/jobs/{job['id']}/exited",
        {"attempt": 1, "exit_code": 0, "reason": "exited"},
        format="json",
    )
    assert resp.json()["state"] == "succeeded"
    assert not Allocation.objects.filter(job_id=job["id"], ended_at__isnull=True).exists()
    states = list(JobEvent.objects.filter(job_id=job["id"]).values_list("to_state", flat=True))
    assert states == ["pending", "queued", "scheduled", "running", "succeeded"]
    logs = api(lab["member"]).get(f"/api/v1/jobs/{job['id']}/logs").json()
    assert logs["text"] == "step 1\n"


def test_another_nodes_token_cannot_touch_the_job(lab, api):
    job = submit(api, lab["member"], gpus=2, gpu_model="H100-80GB-SXM")
    run_cycle()
    other = "h2" if node_of(job["id"]) == "h1" else "h1"
    client = agent(lab["tokens"][other])
    assert client.get("/api/agent/v1/assignments").json()["assignments"] == []
    resp = client.post(
        f"/api/agent/v1/jobs/{job['id']}/exited",
        {"attempt": 1, "exit_code": 0, "reason": "exited"},
        format="json",
    )
    assert resp.status_code == 409
    assert Job.objects.get(pk=job["id"]).state == JobState.SCHEDULED
    assert agent("gpn_forged").get("/api/agent/v1/assignments").status_code == 401
    # a user's API session is not an agent
    assert api(lab["member"]).get("/api/agent/v1/assignments").status_code in (401, 403)


def test_cancel_frees_gpus_at_once_and_agent_stops(lab, api):
    job = submit(api, lab["member"], gpus=2, gpu_model="H100-80GB-SXM")
    run_cycle()
    node = node_of(job["id"])
    resp = api(lab["member"]).post(f"/api/v1/jobs/{job['id']}/cancel")
    assert resp.json()["state"] == "cancelled"
    assert not Allocation.objects.filter(job_id=job["id"], ended_at__isnull=True).exists()
    assert agent(lab["tokens"][node]).get("/api/agent/v1/assignments").json()["assignments"] == []
    assert api(lab["viewer"]).post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 403
    assert api(lab["member"]).post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 400


def test_failure_restarts_then_fails(lab, api, ckpt_volume):
    job = submit(
        api,
        lab["member"],
        gpus=1,
        gpu_model="H100-80GB-SXM",
        max_restarts=1,
        checkpoint="ckpt:a",
    )
    for attempt, expected in [(1, "queued"), (2, "failed")]:
        run_cycle()
        client = agent(lab["tokens"][node_of(job["id"])])
        client.post(f"/api/agent/v1/jobs/{job['id']}/started", {"attempt": attempt}, format="json")
        resp = client.post(
            f"/api/agent/v1/jobs/{job['id']}/exited",
            {"attempt": attempt, "exit_code": 3, "reason": "exited"},
            format="json",
        )
        assert resp.json()["state"] == expected
    row = Job.objects.get(pk=job["id"])
    assert row.exit_code == 3 and "exit code 3" in row.failure_reason and row.restarts == 1


def test_preempt_and_resume_from_checkpoint(lab, api, ckpt_volume):
    lab["a"].quota.max_priority = 3
    lab["a"].quota.save()
    low = submit(
        api,
        lab["member"],
        gpus=4,
        gpu_model="H100-80GB-SXM",
        preemptible=True,
        priority="low",
        checkpoint="ckpt:runs/low",
    )
    run_cycle()
    Job.objects.filter(pk=low["id"]).update(min_runtime_s=0)
    high = submit(api, lab["owner"], gpus=2, gpu_model="H100-80GB-SXM", priority="high")
    result = run_cycle()
    assert result.preempted == [low["id"]]
    assert Job.objects.get(pk=low["id"]).state == JobState.PREEMPTING
    assert Job.objects.get(pk=high["id"]).state == JobState.QUEUED
    # the agent of each node sees "stop" for the victim
    for name in ("h1", "h2"):
        a = agent(lab["tokens"][name]).get("/api/agent/v1/assignments").json()["assignments"]
        assert a and a[0]["action"] == "stop" and a[0]["stop_reason"] == "preempt"
    agent(lab["tokens"]["h1"]).post(
        f"/api/agent/v1/jobs/{low['id']}/exited",
        {"attempt": 1, "exit_code": 143, "reason": "preempted"},
        format="json",
    )
    victim = Job.objects.get(pk=low["id"])
    assert victim.state == JobState.QUEUED and victim.resume
    assert set(Allocation.objects.filter(job=victim).values_list("end_reason", flat=True)) == {
        "preempted"
    }
    run_cycle()
    assert Job.objects.get(pk=high["id"]).state == JobState.SCHEDULED
    # the victim resumes later with RESUME=1 and the same checkpoint: a volume and a path in
    # it (the agent sets CHECKPOINT_DIR to its container path), never a host path
    api(lab["owner"]).post(f"/api/v1/jobs/{high['id']}/cancel")
    run_cycle()
    node = node_of(low["id"])
    a = agent(lab["tokens"][node]).get("/api/agent/v1/assignments").json()["assignments"][0]
    assert a["env"]["RESUME"] == "1" and a["attempt"] == 2
    assert "CHECKPOINT_DIR" not in a["env"]
    assert a["checkpoint"] == {"volume": "ckpt", "path": "runs/low"}
    assert a["volumes"] == [
        {
            "id": ckpt_volume.pk,
            "name": "ckpt",
            "kind": "shared",
            "mount_path": "/data/ckpt",
            "read_only": False,
            "limit_mib": 10 * 1024,
        }
    ]
    assert a["project_id"] == lab["a"].pk


def test_gang_spreads_over_two_nodes(lab, api):
    job = submit(api, lab["member"], gpus=4, gpu_model="H100-80GB-SXM")
    assert run_cycle().placed == [job["id"]]
    nodes = set(Allocation.objects.filter(job_id=job["id"]).values_list("node__name", flat=True))
    assert nodes == {"h1", "h2"}
    gang = submit(
        api, lab["member"], name="gang", nodes=2, gpus_per_node=2, gpu_model="H100-80GB-SXM"
    )
    run_cycle()
    detail = api(lab["member"]).get(f"/api/v1/jobs/{gang['id']}").json()
    assert detail["state"] == "queued"
    assert detail["pending"]["reason"] and detail["pending"]["message"]


def test_fractions_share_one_gpu_up_to_its_capacity_and_memory(lab, api):
    # One usable L4, time-sliced ×2: capacity 2000 milli-GPU, about 22,900 MiB.
    gpus = list(Gpu.objects.filter(node__name="l1").order_by("index"))
    Gpu.objects.filter(pk__in=[g.pk for g in gpus[1:]]).update(health=Gpu.Health.UNHEALTHY)
    ids = [
        submit(
            api, lab["member"], name=f"f{i}", gpu_milli=500, gpu_memory_mib=5000, gpu_model="L4"
        )["id"]
        for i in range(5)
    ]
    run_cycle()
    allocs = list(Allocation.objects.filter(job_id__in=ids))
    assert {a.gpu_id for a in allocs} == {gpus[0].pk}
    assert len(allocs) == 4 and sum(a.share_milli for a in allocs) == 2000
    waiting = Job.objects.get(pk=ids[4])
    assert waiting.state == JobState.QUEUED and waiting.pending_reason

    # Memory binds before shares do: three 8 GB slices do not fit in 22.9 GB.
    for pk in ids[:4]:
        api(lab["member"]).post(f"/api/v1/jobs/{pk}/cancel")
    api(lab["member"]).post(f"/api/v1/jobs/{ids[4]}/cancel")
    big = [
        submit(
            api, lab["member"], name=f"m{i}", gpu_milli=250, gpu_memory_mib=8000, gpu_model="L4"
        )["id"]
        for i in range(3)
    ]
    run_cycle()
    assert Allocation.objects.filter(job_id__in=big, ended_at__isnull=True).count() == 2


def test_quota_rejections_and_borrowing(lab, api):
    quota = lab["a"].quota
    quota.max_gpus_per_job = 2
    quota.save()
    job = submit(api, lab["member"], gpus=4)
    assert job["state"] == "rejected" and "at most 2 per job" in job["failure_reason"]
    quota.max_gpus_per_job = 8
    quota.max_gpus = 1
    quota.allow_borrowing = False
    quota.save()
    job = submit(api, lab["member"], gpus=2)
    assert job["state"] == "rejected" and "quota is 1" in job["failure_reason"]
    job = submit(api, lab["member"], gpus=1, priority="urgent")
    assert job["state"] == "rejected" and "ceiling" in job["failure_reason"]
    quota.allow_borrowing = True
    quota.save()
    job = submit(api, lab["member"], gpus=2)
    assert job["state"] == "queued" and job["borrowed"] is True


def test_per_model_quota_holds_concurrency(lab, api):
    QuotaModelLimit.objects.create(quota=lab["a"].quota, gpu_model=lab["h100"], max_gpus=2)
    lab["a"].quota.allow_borrowing = False
    lab["a"].quota.save()
    first = submit(api, lab["member"], gpus=2, gpu_model="H100-80GB-SXM")
    second = submit(api, lab["member"], gpus=1, gpu_model="H100-80GB-SXM")
    run_cycle()
    assert Job.objects.get(pk=first["id"]).state == JobState.SCHEDULED
    waiting = api(lab["member"]).get(f"/api/v1/jobs/{second['id']}").json()
    assert waiting["state"] == "queued" and waiting["pending"]["reason"] == "quota"


def test_manifest_import(lab, api):
    manifest = """
apiVersion: batch/v1
kind: Job
metadata:
  name: resnet
  namespace: alpha
  annotations:
    gpucloud.example/runtime-estimate-seconds: "3600"
spec:
  backoffLimit: 2
  template:
    spec:
      containers:
      - name: main
        image: nvcr.io/nvidia/pytorch:24.05-py3
        command: ["python", "train.py"]
        args: ["--epochs", "3"]
        env: [{name: EPOCHS, value: "3"}]
        resources:
          limits: {nvidia.com/gpu: 2, nvidia.com/gpu.model: H100-80GB-SXM, cpu: "8", memory: 64Gi}
      restartPolicy: Never
"""
    resp = api(lab["member"]).generic(
        "POST", "/api/v1/jobs/manifest", manifest, content_type="application/yaml"
    )
    assert resp.status_code == 201, resp.content
    job = Job.objects.get(pk=resp.json()["id"])
    assert (job.gpus, job.gpu_model.name, job.cpu_milli, job.memory_mib) == (
        2,
        "H100-80GB-SXM",
        8000,
        65536,
    )
    assert job.command == "python train.py --epochs 3" and job.max_restarts == 2
    assert (
        job.source == "manifest" and job.runtime_estimate_s == 3600 and job.env == {"EPOCHS": "3"}
    )


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ("kind: Deployment", "kind"),
        ("nvidia.com/gpu: two", "nvidia.com/gpu"),
        ("nvidia.com/gpu.model: B300", "unknown GPU model"),
        ("memory: lots", "memory"),
        ("{{{", "not valid YAML"),
    ],
)
def test_bad_manifests_are_400_with_the_path(lab, api, patch, field):
    base = 'apiVersion: batch/v1\nkind: Job\nmetadata: {name: x, namespace: alpha}\nspec:\n  template:\n    spec:\n      containers:\n      - name: main\n        command: ["true"]\n        resources:\n          limits:\n            nvidia.com/gpu: 1\n'
    if patch.startswith("kind"):
        text = base.replace("kind: Job", patch)
    elif patch == "{{{":
        text = patch
    elif patch.startswith("memory"):
        text = base + "            " + patch + "\n"
    else:
        key = patch.split(":")[0]
        text = (
            base.replace("nvidia.com/gpu: 1", "nvidia.com/gpu: 1\n            " + patch)
            if "model" in key
            else base.replace("nvidia.com/gpu: 1", patch)
        )
    resp = api(lab["member"]).generic(
        "POST", "/api/v1/jobs/manifest", text, content_type="application/yaml"
    )
    assert resp.status_code == 400, resp.content
    assert field in str(resp.json())
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"gpus": 0}, "gpus"),
        ({"gpus": 2, "gpu_milli": 500}, "gpu_milli"),
        ({"nodes": 2}, "nodes"),
        ({"gpu_model": "B300"}, "gpu_model"),
        ({"precisions": ["fp4"]}, "precisions"),
        ({"gpu_model": "T4", "precisions": ["bf16"]}, "precisions"),
        ({"gpu_model": "L4", "min_gpu_memory_gb": 40}, "min_gpu_memory_gb"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"checkpoint_dir": "relative/path"}, "checkpoint_dir"),
        ({"checkpoint_dir": "/root"}, "checkpoint_dir"),
        ({"working_dir": "/root"}, "working_dir"),
        ({"working_dir": "/srv/portal/.venv/lib/python3.12/site-packages"}, "working_dir"),
        ({"working_dir": "/var/lib/gpu-agent/jobs/7"}, "working_dir"),
        ({"working_dir": "workspace"}, "working_dir"),
        ({"working_dir": "/workspace/../root"}, "working_dir"),
        ({"checkpoint": "/var/lib/gpu-agent/jobs/7"}, "checkpoint"),
        ({"checkpoint": "ckpt:../../jobs/7"}, "checkpoint"),
        ({"checkpoint": "ckpt:/etc"}, "checkpoint"),
        ({"env": {"CHECKPOINT_DIR": "/root"}}, "env"),
        ({"volumes": [{"name": "ckpt", "path": "data"}]}, "volumes"),
        ({"volumes": [{"name": "ckpt", "path": "/data/../etc"}]}, "volumes"),
        ({"volumes": [{"name": "ckpt", "path": "/proc/x"}]}, "volumes"),
        ({"volumes": [{"name": "Bad/Name"}]}, "volumes"),
        ({"volumes": [{"name": "x", "host_path": "/root"}]}, "volumes"),
        ({"priority": "mega"}, "priority"),
        ({"elastic_min": 4, "gpus": 2}, "elastic_min"),
        ({"gpus": "many"}, "gpus"),
        ({"project": "beta"}, "detail"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_invalid_job_fields_are_400_naming_the_field(lab, api, fields, bad):
    body = {"project": "alpha", "name": "x", "command": "true", **fields}
    resp = api(lab["member"]).post("/api/v1/jobs", body, format="json")
    assert resp.status_code in (400, 404), resp.content
    assert bad in resp.json()
    assert Job.objects.count() == 0


def test_dry_run_estimates_cost_and_start(lab, api):
    body = {
        "project": "alpha",
        "name": "x",
        "command": "true",
        "gpus": 2,
        "gpu_model": "H100-80GB-SXM",
        "runtime_estimate_s": 7200,
    }
    resp = api(lab["member"]).post("/api/v1/jobs/dry-run", body, format="json").json()
    assert resp["admitted"] and resp["would_start_now"]
    assert (
        resp["rate_per_gpu_hour"] == "3.5000"
        and resp["cost_per_hour"] == "7.00"
        and resp["cost_for_estimate"] == "14.00"
    )
    submit(api, lab["member"], gpus=4, gpu_model="H100-80GB-SXM", runtime_estimate_s=3600)
    run_cycle()
    resp = api(lab["member"]).post("/api/v1/jobs/dry-run", body, format="json").json()
    assert not resp["would_start_now"] and resp["estimated_start"] is not None
    assert resp["wait_reason"] and resp["wait_message"]
    assert Job.objects.count() == 1


def test_viewer_cannot_submit_and_outsider_cannot_see(lab, api):
    resp = api(lab["viewer"]).post(
        "/api/v1/jobs", {"project": "alpha", "name": "x", "command": "true"}, format="json"
    )
    assert resp.status_code == 403
    job = submit(api, lab["member"])
    assert api(lab["outsider"]).get(f"/api/v1/jobs/{job['id']}").status_code == 404
    assert api(lab["outsider"]).get("/api/v1/jobs").json()["results"] == []
    Membership.objects.filter(project=lab["a"], user=lab["member"]).update(role=Role.VIEWER)
    assert api(lab["member"]).post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 403


def test_array_job_gives_each_shard_its_index(lab, api):
    jobs = (
        api(lab["member"])
        .post(
            "/api/v1/jobs",
            {
                "project": "alpha",
                "name": "render",
                "command": "render.sh",
                "gpu_model": "L4",
                "shard_count": 3,
            },
            format="json",
        )
        .json()
    )
    assert [j["shard_index"] for j in jobs] == [0, 1, 2]
    run_cycle()
    envs = [
        a["env"]
        for a in agent(lab["tokens"]["l1"]).get("/api/agent/v1/assignments").json()["assignments"]
    ]
    assert sorted((e["SHARD_INDEX"], e["SHARD_COUNT"]) for e in envs) == [
        ("0", "3"),
        ("1", "3"),
        ("2", "3"),
    ]


def test_job_list_has_no_n_plus_one(lab, api, django_assert_max_num_queries):
    for i in range(5):
        submit(api, lab["member"], name=f"j{i}")
    client = api(lab["member"])
    with django_assert_max_num_queries(6):
        resp = client.get("/api/v1/jobs?state=queued")
    assert len(resp.json()["results"]) == 5


@pytest.fixture
def volumes(lab):
    """Project A: a shared `ckpt`, a ready dataset `ds`, a deleted `gone`; B: `theirs`."""
    from storage.models import FillState, Volume, VolumeKind, VolumeState

    made = {
        "ckpt": Volume.objects.create(project=lab["a"], name="ckpt", kind="shared", size_gib=5),
        "ds": Volume.objects.create(
            project=lab["a"], name="ds", kind="shared", size_gib=5, is_dataset=True,
            fill_state=FillState.READY,
        ),
        "gone": Volume.objects.create(
            project=lab["a"], name="gone", kind="shared", size_gib=5, state=VolumeState.DELETED
        ),
        "theirs": Volume.objects.create(
            project=lab["b"], name="theirs", kind=VolumeKind.NODE_LOCAL, size_gib=5
        ),
    }  # fmt: skip
    return made


@pytest.mark.parametrize(
    ("volumes_asked", "checkpoint", "why"),
    [
        ([{"name": "nope"}], "", "no volume named 'nope'"),
        ([{"name": "theirs"}], "", "no volume named 'theirs'"),
        ([{"name": "gone"}], "", "no volume named 'gone'"),
        ([{"name": "ds"}], "", "dataset: mount it read-only"),
        ([{"name": "ckpt", "path": "/d"}, {"name": "ds", "path": "/d", "read_only": True}], "",
         "/d"),
        ([{"name": "ckpt", "path": "/d"}, {"name": "ds", "path": "/d/x", "read_only": True}],
         "", "/d/x"),
        ([{"name": "ckpt", "read_only": True}], "ckpt:a", "read-only"),
        ([{"name": "ckpt"}, {"name": "ckpt", "path": "/x"}], "", "mounted twice"),
        ([{"name": "ckpt", "path": "/workspace/data"}], "", "workspace"),
    ],
)  # fmt: skip
def test_volumes_a_job_may_not_mount_are_400_naming_the_field(
    lab, api, volumes, volumes_asked, checkpoint, why
):
    body = {"project": "alpha", "name": "x", "command": "true", "volumes": volumes_asked}
    if checkpoint:
        body["checkpoint"] = checkpoint
    resp = api(lab["member"]).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 400, resp.content
    field = "checkpoint" if checkpoint else "volumes"
    assert field in resp.json() and why in str(resp.json()), resp.json()
    assert Job.objects.count() == 0


def test_a_job_mounts_volumes_and_checkpoints_in_one(lab, api, volumes):
    job = submit(
        api,
        lab["member"],
        volumes=[{"name": "ds", "read_only": True}, {"name": "tmp", "kind": "scratch"}],
        checkpoint="ckpt:runs/a",
        working_dir="/data/ckpt/runs",
    )
    assert job["volumes"] == [
        {"name": "ds", "path": "/data/ds", "read_only": True},
        {"name": "tmp", "path": "/data/tmp", "read_only": False, "kind": "scratch", "size_gib": 10},
        {"name": "ckpt", "path": "/data/ckpt", "read_only": False},
    ]
    assert job["checkpoint"] == "ckpt:runs/a"
    detail = api(lab["member"]).get(f"/api/v1/jobs/{job['id']}").json()
    assert detail["working_dir"] == "/data/ckpt/runs"
    # an active job's volume cannot be deleted (the scheduler's port)
    resp = api(lab["owner"]).delete("/api/v1/projects/alpha/volumes/ckpt")
    assert resp.status_code == 409 and str(job["id"]) in str(resp.json()), resp.content


FORM = {
    "project": "alpha",
    "name": "vol",
    "command": "python train.py",
    "gpu_model": "H100-80GB-SXM",
    "shape": "whole",
    "gpus": "1",
    "priority": "1",
    "shard_count": "1",
    "max_restarts": "0",
}


def test_the_form_mounts_volumes_and_puts_a_host_path_next_to_its_field(lab, client, volumes):
    client.force_login(lab["member"])
    for fields, field, words in [
        ({"working_dir": "/root"}, "working_dir", "never a host path"),
        ({"checkpoint": "/srv/ckpt"}, "checkpoint", "host path is never accepted"),
        ({"volumes": "ds:/in"}, "volumes", "dataset"),
        ({"volumes": "ds:in"}, "volumes", "Line 1"),
        ({"volumes": "theirs"}, "volumes", "no volume named 'theirs'"),
    ]:
        resp = client.post("/jobs/new/", {**FORM, **fields})
        assert resp.status_code == 400, fields
        errors = resp.context["form"].errors
        assert field in errors and words in errors[field][0], (fields, errors)
    assert not Job.objects.exists()
    resp = client.post(
        "/jobs/new/",
        {**FORM, "volumes": "ds:/in:ro\n", "checkpoint": "ckpt:r", "working_dir": "/in"},
    )
    assert resp.status_code == 302, resp.content.decode()[:2000]
    job = Job.objects.get()
    assert job.volumes[0] == {"name": "ds", "path": "/in", "read_only": True}
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="job-volumes"' in page and "ckpt:r" in page
    clone = client.get(f"/jobs/new/?from={job.pk}").content.decode()
    assert "ds:/in:ro" in clone
