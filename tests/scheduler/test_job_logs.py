"""Job logs from agents: closed once the attempt ended; a quota per job (a default, settable
per project) with a truncation note on the job page, in the API and in the CLI (tests/cli)."""

from __future__ import annotations

import pytest
from django.test import Client

from scheduler.admission import job_cancel
from scheduler.models import Job, LogChunk, Quota

pytestmark = pytest.mark.django_db


def logs_url(job: Job) -> str:
    return f"/api/agent/v1/jobs/{job.pk}/logs"


def chunk(seq: int, text: str) -> dict:
    return {"attempt": 1, "seq": seq, "stream": "stdout", "text": text}


def test_logs_of_an_ended_job_are_refused(placed):
    client, job = placed["client"], placed["job"]
    assert client.post(logs_url(job), chunk(0, "epoch 1\n"), format="json").status_code == 201
    exited = {"kind": "exited", "job_id": job.pk, "attempt": 1, "exit_code": 0, "reason": "exited"}
    client.post("/api/agent/v1/sync", {"reports": [exited]}, format="json")
    resp = client.post(logs_url(job), chunk(1, "forged line\n"), format="json")
    assert resp.status_code == 409
    assert resp.json()["code"] == "job_ended" and "ended" in resp.json()["message"]
    assert list(LogChunk.objects.filter(job=job).values_list("text", flat=True)) == ["epoch 1\n"]


def test_logs_of_a_cancelled_job_are_refused(placed, team):
    client, job = placed["client"], placed["job"]
    job_cancel(actor=team["member"], job=job)
    resp = client.post(logs_url(job), chunk(0, "late\n"), format="json")
    assert resp.status_code == 409 and resp.json()["code"] == "job_ended"
    assert not LogChunk.objects.filter(job=job).exists()


def test_the_default_quota_cuts_the_output_and_says_so(placed, settings, team, api):
    settings.JOB_LOG_QUOTA_BYTES = 1024
    client, job = placed["client"], placed["job"]
    assert client.post(logs_url(job), chunk(0, "a" * 1000), format="json").status_code == 201
    assert client.post(logs_url(job), chunk(1, "é" * 30), format="json").status_code == 201
    resp = client.post(logs_url(job), chunk(2, "more\n"), format="json")
    assert resp.status_code == 200 and resp.json() == {"stored": False}
    job.refresh_from_db()
    stored = "".join(
        LogChunk.objects.filter(job=job).order_by("seq").values_list("text", flat=True)
    )
    assert stored == "a" * 1000 + "é" * 12  # cut at the quota, on a character boundary
    assert job.log_bytes == 1024 and job.log_quota_hit == 1024
    answer = api(team["member"]).get(f"/api/v1/jobs/{job.pk}/logs").json()
    assert answer["truncated"] is True and "log truncated" in answer["note"]
    page = Client()
    page.force_login(team["member"])
    assert "log truncated" in page.get(f"/jobs/{job.pk}/").content.decode()


def test_a_project_sets_its_own_quota(placed, team, api):
    client, job = placed["client"], placed["job"]
    Quota.objects.filter(project=job.project).update(log_quota_bytes=2048)
    assert client.post(logs_url(job), chunk(0, "x" * 2000), format="json").status_code == 201
    assert client.post(logs_url(job), chunk(1, "y" * 100), format="json").status_code == 201
    job.refresh_from_db()
    assert job.log_bytes == 2048 and job.log_quota_hit == 2048
    answer = api(team["member"]).get(f"/api/v1/jobs/{job.pk}/logs").json()
    assert "log quota of 2 KiB" in answer["note"]


def test_within_the_quota_nothing_is_said(placed, team, api):
    client, job = placed["client"], placed["job"]
    client.post(logs_url(job), chunk(0, "fine\n"), format="json")
    answer = api(team["member"]).get(f"/api/v1/jobs/{job.pk}/logs").json()
    assert answer["truncated"] is False and answer["note"] == ""
