"""Jobs end to end on the running stack: live server, real Celery worker on Redis, PostgreSQL,
and node agents as real processes running real shell commands."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from portal.services import token_create
from scheduler.models import Job, JobState, LogChunk
from tests.polling import wait_for
from tests.stack_fixtures import wait_for_registration

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(celery_live_worker, agents, team, fleet, settings):
    settings.AGENT_PORTAL_URL = agents.url
    for name in ("h1", "h2"):
        agents.start(name, fleet["tokens"][name], "2xH100-80GB-SXM")
    wait_for_registration(["h1", "h2"])
    client = APIClient()
    secret = token_create(user=team["member"], name="e2e").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return {"api": client, "agents": agents, **team, **fleet}


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


def test_preempt_and_resume_from_checkpoint(stack, tmp_path: Path):
    stack["a"].quota.max_priority = 3
    stack["a"].quota.save()
    ckpt = tmp_path / "ckpt"
    low = submit(
        stack,
        name="low",
        gpus=4,
        preemptible=True,
        priority="low",
        checkpoint_dir=str(ckpt),
        command="python3 -m agent.workload --seconds 30 --checkpoint-every 1",
    )
    wait_for(lambda: state_of(low) == JobState.RUNNING, timeout=60)
    Job.objects.filter(pk=low).update(min_runtime_s=0)
    wait_for(lambda: ckpt.exists() and any(ckpt.iterdir()), timeout=20)
    high = submit(stack, name="high", gpus=2, priority="high", command="sleep 1")
    wait_for(lambda: state_of(low) in (JobState.PREEMPTING, JobState.QUEUED), timeout=60)
    wait_for(lambda: state_of(high) == JobState.SUCCEEDED, timeout=60)
    wait_for(
        lambda: Job.objects.get(pk=low).attempt >= 2 and state_of(low) == JobState.RUNNING,
        timeout=40,
    )
    text = "".join(LogChunk.objects.filter(job_id=low, attempt=2).values_list("text", flat=True))
    wait_for(
        lambda: (
            "resum"
            in "".join(
                LogChunk.objects.filter(job_id=low, attempt=2).values_list("text", flat=True)
            ).lower()
        ),
        timeout=20,
    )
    job = Job.objects.get(pk=low)
    assert job.resume and job.checkpoint_dir == str(ckpt)
    del text
