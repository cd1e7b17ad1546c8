"""Jobs in containers on the running stack: a live portal, a real Celery worker, and a node
agent as a real process running each job through Podman (the container runtime) with the job
image `scripts/test-containers.sh` builds. A tenant's job that attacks the node, another job or
the management plane gets nothing; OOM, a missing image and the digest reach the job."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from agent.runtime.base import job_uid
from billing.services import usage_meter
from portal.services import token_create
from scheduler.models import Allocation, Job, JobState, LogChunk, Node
from tests.polling import wait_for
from tests.stack_fixtures import wait_for_registration

IMAGE = os.environ.get("RUNTIME_TEST_IMAGE", "")
pytestmark = [
    pytest.mark.celery,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not IMAGE,
        reason=os.environ.get("RUNTIME_TEST_SKIP")
        or "no job image: run through scripts/test.sh (it builds one with mmdebstrap)",
    ),
]

# What a launcher may have left in the agent's environment: none of it may reach a job.
PORTAL_SECRETS = {
    "STRIPE_SECRET_KEY": "sk_test_leaked_stripe",
    "STRIPE_WEBHOOK_SECRET": "whsec_leaked",
    "EMAIL_HOST_PASSWORD": "leaked-mail-password",
    "METRICS_TOKEN": "leaked-metrics-token",
    "REDIS_URL": "redis://127.0.0.1:6379/5",
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/leaked",
}

ATTACK = r"""
import json, os, signal, socket, sys
agent_pid, token_file, victim_file, portal_port = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
got = {}
def attempt(name, fn):
    try:
        got[name] = "GOT " + repr(fn())[:200]
    except Exception as exc:
        got[name] = "blocked: " + type(exc).__name__
attempt("token file", lambda: open(token_file).read())
attempt("agent environ", lambda: open(f"/proc/{agent_pid}/environ", "rb").read())
attempt("agent memory", lambda: open(f"/proc/{agent_pid}/mem", "rb").read(1))
attempt("other job's file", lambda: open(victim_file).read())
attempt("signal the agent", lambda: os.kill(agent_pid, signal.SIGSTOP))
def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.close()
    return port
attempt("redis", lambda: connect(6379))
attempt("postgresql", lambda: connect(5432))
attempt("agent api", lambda: connect(portal_port))
got["env"] = sorted(os.environ)
got["env values"] = "\n".join(os.environ.values())
print("ATTACK " + json.dumps(got), flush=True)
"""


@pytest.fixture
def stack(celery_live_worker, agents, team, fleet, settings, tmp_path):
    settings.AGENT_PORTAL_URL = agents.url
    token_file = agents.workdir / "c1.token"
    token_file.write_text(fleet["tokens"]["h1"])
    token_file.chmod(0o600)
    agents.start(
        "h1",
        fleet["tokens"]["h1"],
        "2xH100-80GB-SXM",
        AGENT_RUNTIME="container",
        AGENT_DEFAULT_IMAGE=IMAGE,
        AGENT_JOB_UID_BASE="200000",
        NODE_TOKEN_FILE=str(token_file),
        **PORTAL_SECRETS,
    )
    wait_for_registration(["h1"])
    Node.objects.filter(name="h2").update(state=Node.State.CORDONED)  # no agent there
    client = APIClient()
    secret = token_create(user=team["member"], name="containers").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return {"api": client, "agents": agents, "token_file": token_file, **team, **fleet}


def submit(stack, **fields):
    body = {"project": "alpha", "name": "ctr", "gpu_model": "H100-80GB-SXM", **fields}
    resp = stack["api"].post(f"{stack['agents'].url}/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def state_of(job_id: int) -> str:
    return Job.objects.get(pk=job_id).state


def logs(job_id: int) -> str:
    return "".join(LogChunk.objects.filter(job_id=job_id).values_list("text", flat=True))


def uid_processes(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_a_tenant_job_attacking_the_node_gets_nothing(stack):
    agent = stack["agents"].procs["h1"]
    workdir = stack["agents"].workdir / "h1"
    # The victim: another tenant's job on the same node, holding a secret in its files.
    victim = submit(stack, name="victim", command="echo victim-secret > secret.txt; sleep 60")
    wait_for(lambda: state_of(victim) == JobState.RUNNING, timeout=60)
    victim_file = workdir / "jobs" / str(victim) / "secret.txt"
    wait_for(victim_file.exists, timeout=20)
    port = int(stack["agents"].url.rsplit(":", 1)[1])
    attack_py = ATTACK.replace("'", "'\"'\"'")
    attacker = submit(
        stack,
        name="attacker",
        env={"MY_SETTING": "mine"},
        # A detached child (its own session) that would outlive the job, then the attacks.
        command=(
            "setsid sh -c 'sleep 30; echo escaped > /workspace/escaped' </dev/null >/dev/null 2>&1 & "
            f"python3 -c '{attack_py}' {agent.pid} {stack['token_file']} {victim_file} {port}"
        ),
    )
    wait_for(lambda: state_of(attacker) in (JobState.SUCCEEDED, JobState.FAILED), timeout=90)
    text = logs(attacker)
    line = next((ln for ln in text.splitlines() if ln.startswith("ATTACK ")), None)
    assert line is not None, text
    got = json.loads(line[len("ATTACK ") :])
    for name in (
        "token file",
        "agent environ",
        "agent memory",
        "other job's file",
        "signal the agent",
        "redis",
        "postgresql",
        "agent api",
    ):
        assert got[name].startswith("blocked"), (name, got[name])
    token = stack["tokens"]["h1"]
    for secret in [token, *PORTAL_SECRETS.values()]:
        assert secret not in got["env values"]
    leaked = set(got["env"]) & {*PORTAL_SECRETS, "NODE_TOKEN", "NODE_TOKEN_FILE", "PORTAL_URL"}
    assert not leaked
    assert "MY_SETTING" in got["env"] and "JOB_ID" in got["env"]
    # The agent was not stopped, and nothing of the attacker's outlived its job.
    assert agent.poll() is None
    assert Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T"
    # The setsid child (30 s of sleep left) went with the container: no process of its uid.
    wait_for(lambda: not uid_processes(job_uid(attacker)), timeout=15)
    # The victim ran on, untouched; its files are its uid's alone.
    assert state_of(victim) == JobState.RUNNING
    assert (victim_file.parent.stat().st_mode & 0o077) == 0
    job = Job.objects.get(pk=attacker)
    assert job.image_digest.startswith("sha256:")


def test_memory_over_the_limit_ends_as_out_of_memory(stack):
    job_id = submit(
        stack,
        memory_mib=96,
        command="python3 -c 'x = bytearray(400 * 1024 * 1024); print(\"survived\")'",
    )
    wait_for(lambda: state_of(job_id) == JobState.FAILED, timeout=90)
    job = Job.objects.get(pk=job_id)
    assert "out of memory" in job.failure_reason, job.failure_reason
    assert "survived" not in logs(job_id)
    resp = stack["api"].get(f"{stack['agents'].url}/api/v1/jobs/{job_id}")
    assert "out of memory" in resp.json()["failure_reason"]


def test_a_missing_image_fails_the_job_naming_it_and_bills_nothing(stack):
    image = "localhost/no-such-image:404"
    job_id = submit(stack, image=image, command="echo never")
    wait_for(lambda: state_of(job_id) == JobState.FAILED, timeout=60)
    job = Job.objects.get(pk=job_id)
    assert image in job.failure_reason and "not found" in job.failure_reason
    assert job.started_at is None and not logs(job_id)
    alloc = Allocation.objects.get(job_id=job_id)
    assert alloc.ended_at == alloc.started_at
    time.sleep(1.1)  # a second later: a metered slice would now have a length
    usage_meter(allocation_ids=[alloc.pk])
    from billing.models import UsageRecord

    assert not UsageRecord.objects.filter(allocation=alloc).exists()
