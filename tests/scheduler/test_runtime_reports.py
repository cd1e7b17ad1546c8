"""What the container runtime reports reaches the job: the image digest it ran, an OOM kill
and a time limit as their own failure reasons (final: no restart), a failed start billed for
nothing."""

from __future__ import annotations

import pytest

from scheduler.models import Allocation, Job, JobState

pytestmark = pytest.mark.django_db

SYNC = "/api/agent/v1/sync"
DIGEST = "sha256:" + "ab" * 32


def started(job, **extra):
    return {"kind": "started", "job_id": job.pk, "attempt": 1, **extra}


def exited(job, reason, message, exit_code=None, signal=None):
    return {
        "kind": "exited",
        "job_id": job.pk,
        "attempt": 1,
        "exit_code": exit_code,
        "signal": signal,
        "reason": reason,
        "message": message,
    }


def test_the_started_report_records_the_image_digest(placed):
    client, job = placed["client"], placed["job"]
    answer = client.post(SYNC, {"reports": [started(job, image_digest=DIGEST)]}, format="json")
    assert answer.status_code == 200, answer.content
    job.refresh_from_db()
    assert job.image_digest == DIGEST and job.state == JobState.RUNNING
    # The one-report endpoint records it too; a digest that is not one is refused.
    Job.objects.filter(pk=job.pk).update(image_digest="")
    url = f"/api/agent/v1/jobs/{job.pk}/started"
    bad = client.post(url, {"attempt": 1, "image_digest": "latest; rm -rf /"}, format="json")
    assert bad.status_code == 400 and "image_digest" in bad.content.decode()
    client.post(url, {"attempt": 1, "image_digest": DIGEST}, format="json")
    assert Job.objects.get(pk=job.pk).image_digest == DIGEST


@pytest.mark.parametrize(
    ("reason", "message", "words"),
    [
        ("oom", "out of memory: the job went over its memory limit of 96 MiB", "out of memory"),
        ("time_limit", "time limit: the job ran past its limit of 3600s", "time limit"),
        (
            "volume_full",
            "volume full: volume ckpt is full (limit 2 GiB): ended after SIGTERM; exit code 143",
            "volume full (volume ckpt is full (limit 2 GiB)",
        ),
    ],
)
def test_oom_and_time_limit_fail_the_job_with_their_own_reason(placed, reason, message, words):
    client, job = placed["client"], placed["job"]
    Job.objects.filter(pk=job.pk).update(max_restarts=3)  # a plain failure would restart
    reports = [started(job), exited(job, reason, message, exit_code=137)]
    answer = client.post(SYNC, {"reports": reports}, format="json").json()
    assert answer["results"][1]["state"] == JobState.FAILED
    job.refresh_from_db()
    assert job.failure_reason.startswith(f"Failed: {words}")
    assert job.restarts == 0


def test_a_failed_start_ends_its_allocation_where_it_began(placed):
    client, job = placed["client"], placed["job"]
    msg = "image 'localhost/nope:1' not found on this node (images are not pulled at start)"
    answer = client.post(SYNC, {"reports": [exited(job, "failed_to_start", msg)]}, format="json")
    assert answer.json()["results"][0]["state"] == JobState.FAILED
    job.refresh_from_db()
    assert "localhost/nope:1" in job.failure_reason
    alloc = Allocation.objects.get(job=job)
    assert alloc.ended_at == alloc.started_at


def test_a_provisioned_agent_inherits_none_of_the_portals_secrets(monkeypatch, fleet):
    from scheduler.provisioning import _agent_env

    secrets = {
        "STRIPE_SECRET_KEY": "sk_test_x",
        "STRIPE_WEBHOOK_SECRET": "whsec_x",
        "EMAIL_HOST_PASSWORD": "pw",
        "METRICS_TOKEN": "mt",
        "REDIS_URL": "redis://127.0.0.1:6379/1",
        "DATABASE_URL": "postgres://x",
        "DJANGO_SECRET_KEY": "dk",
    }
    for key, value in {**secrets, "AGENT_RUNTIME": "container", "PATH": "/usr/bin"}.items():
        monkeypatch.setenv(key, value)
    env = _agent_env(fleet["nodes"]["h1"], "gpn_token", {"AGENT_HOSTNAME": "h1"})
    assert not set(env) & set(secrets)
    assert env["NODE_TOKEN"] == "gpn_token" and env["AGENT_RUNTIME"] == "container"
    assert env["PATH"] == "/usr/bin" and env["AGENT_HOSTNAME"] == "h1"
