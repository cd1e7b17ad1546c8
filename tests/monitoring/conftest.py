"""Monitoring fixtures: an isolated Redis key space per test, a running job, heartbeats."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from django.db.models import F
from django.utils import timezone
from rest_framework.test import APIClient

from monitoring import live
from monitoring.ingest import ingest_samples
from portal.models import Project, User
from portal.services import project_create
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job, JobState


@pytest.fixture(autouse=True)
def mon_keys(settings):
    """Each test writes its live window and raw samples under its own Redis prefix."""
    settings.MONITORING_KEY_PREFIX = f"test-mon-{uuid.uuid4().hex[:10]}"
    yield settings.MONITORING_KEY_PREFIX
    live.clear()


def agent(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


@pytest.fixture
def running(team, fleet, api):
    """A 1-GPU H100 job of project alpha (submitted by the member), placed and running."""
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "train", "command": "true", "gpu_model": "H100-80GB-SXM"},
        format="json",
    )
    job = Job.objects.get(pk=resp.json()["id"])
    run_cycle()
    # the GPU has been held for two hours: samples the tests date in that time are the job's
    Allocation.objects.filter(job=job).update(started_at=F("started_at") - timedelta(hours=2))
    alloc = Allocation.objects.get(job=job)
    client = agent(fleet["tokens"][alloc.node.name])
    client.post(f"/api/agent/v1/jobs/{job.pk}/started", {"attempt": 1}, format="json")
    job.refresh_from_db()
    return {"job": job, "alloc": alloc, "node": alloc.node, "gpu": alloc.gpu, "client": client}


def sample(gpu, **values):
    base = {
        "gpu_id": gpu.pk,
        "uuid": gpu.uuid,
        "utilization": 50.0,
        "memory_used_mib": 1000,
        "temperature_c": 55.0,
        "power_w": 300.0,
    }
    return {**base, **values}


def feed(node, gpus, *, start: datetime, minutes: float, every_s: int = 30, **values) -> datetime:
    """Ingest samples for `gpus` from `start` every `every_s` seconds; returns the end time."""
    t = start
    end = start + timedelta(minutes=minutes)
    while t < end:
        ingest_samples(node=node, samples=[sample(g, **values) for g in gpus], now=t)
        t += timedelta(seconds=every_s)
    return t


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


def hold(gpu, *, share=1000, now, started=None, project=None, owner=None, preemptible=False):
    """A running job holding `share` of `gpu` since `started` (rows written directly)."""
    if owner is None:
        owner = User.objects.create_user(f"o{uuid.uuid4().hex[:8]}@example.org", "pw-123456")
    if project is None:
        project = project_create(owner=owner, slug=f"p-{uuid.uuid4().hex[:8]}", name="P")
    job = Job.objects.create(
        project=project,
        submitted_by=owner,
        name="held",
        command="sleep 1",
        state=JobState.RUNNING,
        gpus=1,
        gpu_milli=share,
        gpu_model=gpu.model,
        preemptible=preemptible,
        attempt=1,
    )
    Allocation.objects.create(
        job=job,
        gpu=gpu,
        node=gpu.node,
        attempt=1,
        share_milli=share,
        gpu_model=gpu.model,
        started_at=started or now - timedelta(hours=1),
    )
    return job


__all__ = ["Project", "agent", "feed", "hold", "sample"]
