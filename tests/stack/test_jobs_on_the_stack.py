"""Jobs end to end on the running stack: live server, real Celery worker on Redis, PostgreSQL,
and node agents as real processes running real shell commands."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from portal.services import token_create
from scheduler.models import Allocation, Job, JobState, LogChunk, Node
from storage.models import Volume, VolumeKind
from tests.polling import wait_for
from tests.stack_fixtures import wait_for_registration

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(celery_live_worker, agents, team, fleet, settings):
    settings.AGENT_PORTAL_URL = agents.url
    for name in ("h1", "h2"):
        agents.start(name, fleet["tokens"][name], "2xH100-80GB-SXM", AGENT_QUOTA_INTERVAL="1")
    wait_for_registration(["h1", "h2"])
    client = APIClient()
    secret = token_create(user=team["member"], name="e2e").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    other = APIClient()  # the second tenant (project beta)
    other.credentials(
        HTTP_AUTHORIZATION=f"Bearer {token_create(user=team['outsider'], name='e2e').secret}"
    )
    return {"api": client, "api_b": other, "agents": agents, **team, **fleet}


def submit(stack, **fields):
    body = {"project": "alpha", "name": "e2e", "gpu_model": "H100-80GB-SXM", **fields}
    resp = stack["api"].post(f"{stack['agents'].url}/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie no longer does)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def state_of(job_id: int) -> str:
    return Job.objects.get(pk=job_id).state


def test_submit_run_succeed_with_logs_and_exit_code(stack):
    job_id = submit(stack, command="echo hello from $JOB_ID on $CUDA_VISIBLE_DEVICES; exit 0")
    wait_for(lambda: state_of(job_id) == JobState.SUCCEEDED, timeout=60)
    job = Job.objects.get(pk=job_id)
    assert job.exit_code == 0
    text = "".join(LogChunk.objects.filter(job=job).values_list("text", flat=True))
    assert f"hello from {job_id} on GPU-" in text
    assert [e for e in job.events.values_list("to_state", flat=True)] == [
        "pending",
        "queued",
        "scheduled",
        "running",
        "succeeded",
    ]


def test_failing_command_reports_its_exit_code(stack):
    job_id = submit(stack, command="echo boom >&2; exit 7")
    wait_for(lambda: state_of(job_id) == JobState.FAILED, timeout=60)
    job = Job.objects.get(pk=job_id)
    assert job.exit_code == 7 and "exit code 7" in job.failure_reason
    assert "boom" in "".join(
        LogChunk.objects.filter(job=job, stream="stderr").values_list("text", flat=True)
    )


def test_cancel_signals_the_whole_process_group(stack, tmp_path: Path):
    pidfile = tmp_path / "child.pid"
    # The job starts a child (it writes its pid, then sleeps); cancel must kill both.
    job_id = submit(stack, command=f"sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 60")
    wait_for(lambda: state_of(job_id) == JobState.RUNNING, timeout=60)
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=30))
    assert alive(child)
    resp = stack["api"].post(f"{stack['agents'].url}/api/v1/jobs/{job_id}/cancel")
    assert resp.json()["state"] == "cancelled"
    assert not Job.objects.get(pk=job_id).allocations.filter(ended_at__isnull=True).exists()
    # The agent signals the whole group on its next poll; the child goes with the shell.
    wait_for(lambda: not alive(child), timeout=30)  # else the child survived the cancel


def shared_volume(stack, name: str, *, project: str = "a", size_gib: int = 1) -> Volume:
    """A shared volume; its files are <shared root>/v<id> on every agent of the pool."""
    return Volume.objects.create(
        project=stack[project], name=name, kind=VolumeKind.SHARED, size_gib=size_gib
    )


def log_of(job_id: int, attempt: int | None = None) -> str:
    chunks = LogChunk.objects.filter(job_id=job_id)
    if attempt is not None:
        chunks = chunks.filter(attempt=attempt)
    return "".join(chunks.order_by("attempt", "seq").values_list("text", flat=True))


def test_preempt_and_resume_from_checkpoint(stack):
    stack["a"].quota.max_priority = 3
    stack["a"].quota.save()
    volume = shared_volume(stack, "ckpt")
    ckpt = stack["agents"].shared_root / f"v{volume.pk}" / "low"
    low = submit(
        stack,
        name="low",
        gpus=4,
        preemptible=True,
        priority="low",
        checkpoint="ckpt:low",
        command="python3 -m agent.workload --seconds 30 --checkpoint-every 1",
    )
    wait_for(lambda: state_of(low) == JobState.RUNNING, timeout=60)
    Job.objects.filter(pk=low).update(min_runtime_s=0)
    wait_for(lambda: (ckpt / "checkpoint.json").exists(), timeout=20)
    high = submit(stack, name="high", gpus=2, priority="high", command="sleep 1")
    wait_for(lambda: state_of(low) in (JobState.PREEMPTING, JobState.QUEUED), timeout=60)
    wait_for(lambda: state_of(high) == JobState.SUCCEEDED, timeout=60)
    wait_for(
        lambda: Job.objects.get(pk=low).attempt >= 2 and state_of(low) == JobState.RUNNING,
        timeout=40,
    )
    wait_for(lambda: "resum" in log_of(low, attempt=2).lower(), timeout=20)
    job = Job.objects.get(pk=low)
    assert job.resume and job.checkpoint == "ckpt:low"


def test_a_shared_checkpoint_resumes_on_another_agent_from_its_last_step(stack):
    """Preempted on one agent (its node drained), the job resumes on the other from the step
    it saved: both agents mount the same shared root (one directory here; NFS in production)."""
    from scheduler.nodes.operator import node_set_state

    volume = shared_volume(stack, "ckpt")
    ckpt = stack["agents"].shared_root / f"v{volume.pk}" / "run"
    job_id = submit(
        stack,
        name="train",
        gpus=2,
        checkpoint="ckpt:run",
        command="python3 -m agent.workload --seconds 12 --step-seconds 0.2 --checkpoint-every 1",
    )
    wait_for(lambda: state_of(job_id) == JobState.RUNNING, timeout=60)
    wait_for(lambda: (ckpt / "checkpoint.json").exists(), timeout=30)
    (first,) = set(Allocation.objects.filter(job_id=job_id).values_list("node__name", flat=True))
    node_set_state(actor=stack["owner"], node=Node.objects.get(name=first), action="drain")
    wait_for(lambda: Job.objects.get(pk=job_id).attempt >= 2, timeout=60)
    wait_for(lambda: state_of(job_id) == JobState.SUCCEEDED, timeout=90)
    second = set(
        Allocation.objects.filter(job_id=job_id, attempt=2).values_list("node__name", flat=True)
    )
    assert second and first not in second
    before, after = log_of(job_id, attempt=1), log_of(job_id, attempt=2)
    saved = int(before.split("checkpoint saved at step ")[1].split(";")[0])
    assert saved > 0 and f"resumed from checkpoint at step {saved}" in after, after


def _running_job_dir(stack) -> Path:
    """Another tenant's running job, and its directory on its agent."""
    theirs = stack["api_b"].post(
        f"{stack['agents'].url}/api/v1/jobs",
        {
            "project": "beta",
            "name": "theirs",
            "command": "sleep 60",
            "gpus": 1,
            "gpu_model": "H100-80GB-SXM",
        },
        format="json",
    )
    assert theirs.status_code == 201, theirs.content
    job_id = theirs.json()["id"]
    wait_for(lambda: state_of(job_id) == JobState.RUNNING, timeout=60)
    node = Allocation.objects.filter(job_id=job_id).values_list("node__name", flat=True)[0]
    return stack["agents"].workdir / node / "jobs" / str(job_id)


def test_host_paths_from_the_security_review_are_400_naming_the_field(stack):
    """The review's reproductions: /root, the portal's own site-packages and another tenant's
    job directory as working or checkpoint directory, by the API and by a manifest."""
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    theirs = _running_job_dir(stack)
    url = f"{stack['agents'].url}/api/v1/jobs"
    base = {"project": "alpha", "name": "x", "command": "true"}
    for path in ("/root", site_packages, str(theirs)):
        for field, value in (
            ("working_dir", path),
            ("checkpoint_dir", path),
            ("checkpoint", path),
            ("checkpoint", f"ckpt:{path}"),
        ):
            resp = stack["api"].post(url, {**base, field: value}, format="json")
            assert resp.status_code == 400 and field in resp.json(), (field, value, resp.content)
        manifest = MANIFEST.format(working_dir=path)
        resp = stack["api"].generic(
            "POST", f"{url}/manifest", manifest, content_type="application/yaml"
        )
        assert resp.status_code == 400, resp.content
        assert [f["field"] for f in resp.json()["refused"]] == [
            "spec.template.spec.containers[0].workingDir"
        ]
    assert Job.objects.filter(project=stack["a"]).count() == 0
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o700  # their workspace is theirs alone


def test_a_symlink_planted_at_the_stop_file_reaches_nothing_outside_its_volume(stack, tmp_path):
    """The job links its checkpoint directory's stop file to a file of the host, and its
    workspace and scratch volume to a host directory; the agent's stop notice (written before
    SIGTERM) replaces the link, the host file is untouched, and when the attempt's workspace
    and scratch are removed the links go, not what they point at. The job runs meanwhile."""
    precious = tmp_path / "precious"
    precious.write_text("the host's own\n")
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "data").write_text("kept\n")
    volume = shared_volume(stack, "ckpt")
    job_id = submit(
        stack,
        name="planter",
        gpus=1,
        checkpoint="ckpt:run",
        volumes=[{"name": "tmp", "kind": "scratch", "size_gib": 1}],
        command=f'ln -sf {precious} "$CHECKPOINT_DIR/stop-requested.json"; '
        f'ln -s {keep} "$VOLUME_TMP/escape"; ln -s {keep} escape; ln -s {precious} out.log; '
        "echo planted; sleep 60",
    )
    wait_for(lambda: "planted" in log_of(job_id), timeout=60)
    assert state_of(job_id) == JobState.RUNNING  # the links stop nothing: the job runs
    (node,) = set(Allocation.objects.filter(job_id=job_id).values_list("node__name", flat=True))
    workspace = stack["agents"].workdir / node / "jobs" / str(job_id)
    assert (workspace / "escape").is_symlink()
    resp = stack["api"].post(f"{stack['agents'].url}/api/v1/jobs/{job_id}/cancel")
    assert resp.json()["state"] == "cancelled"
    stop_file = stack["agents"].shared_root / f"v{volume.pk}" / "run" / "stop-requested.json"
    wait_for(lambda: stop_file.exists() and not stop_file.is_symlink(), timeout=30)
    notice = json.loads(stop_file.read_text())  # cancelled: no longer assigned, "killed"
    assert notice["job_id"] == job_id and notice["reason"] in ("cancel", "killed")
    wait_for(lambda: not workspace.exists(), timeout=30)  # removed, links and all
    assert precious.read_text() == "the host's own\n" and not precious.is_symlink()
    assert (keep / "data").read_text() == "kept\n"


def test_a_job_writing_past_its_volume_is_stopped_and_no_other_project_is_touched(stack):
    """A shared volume of 1 GiB is measured (no image on a shared filesystem): a job that
    allocates 1.2 GiB in it is stopped as "volume X is full (limit 1 GiB)"; another project's
    job and volume go on."""
    theirs = shared_volume(stack, "theirs", project="b")
    their_job = stack["api_b"].post(
        f"{stack['agents'].url}/api/v1/jobs",
        {
            "project": "beta", "name": "other", "gpus": 1, "volumes": [{"name": "theirs"}],
            "gpu_model": "H100-80GB-SXM",
            "command": 'echo kept > "$VOLUME_THEIRS/mine"; sleep 60',
        },
        format="json",
    )  # fmt: skip
    assert their_job.status_code == 201, their_job.content
    their_id = their_job.json()["id"]
    shared_volume(stack, "small")
    job_id = submit(
        stack,
        name="filler",
        gpus=1,
        volumes=[{"name": "small"}],
        command='fallocate -l 1200M "$VOLUME_SMALL/blob" && echo filled; sleep 120',
    )
    wait_for(lambda: state_of(job_id) == JobState.FAILED, timeout=90)
    job = Job.objects.get(pk=job_id)
    assert "volume small is full (limit 1 GiB)" in job.failure_reason, job.failure_reason
    assert "filled" in log_of(job_id)
    assert state_of(their_id) == JobState.RUNNING
    assert (stack["agents"].shared_root / f"v{theirs.pk}" / "mine").read_text() == "kept\n"


MANIFEST = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: review
  namespace: alpha
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        command: ["true"]
        workingDir: {working_dir}
        resources:
          limits:
            nvidia.com/gpu: 1
"""
