"""Fixtures shared by the scheduler's tests."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job


def _agent(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


@pytest.fixture
def placed(team, fleet, api, django_capture_on_commit_callbacks):
    """One 1-GPU H100 job, placed on a node (scheduled, not yet started): the job, its node,
    an agent client of that node and one of the other H100 node."""
    with django_capture_on_commit_callbacks(execute=True):
        resp = api(team["member"]).post(
            "/api/v1/jobs",
            {"project": "alpha", "name": "s", "command": "true", "gpu_model": "H100-80GB-SXM"},
            format="json",
        )
        run_cycle()
    job = Job.objects.get(pk=resp.json()["id"])
    alloc = Allocation.objects.get(job=job)
    other = next(n for n in ("h1", "h2") if n != alloc.node.name)
    return {
        "job": job,
        "node": alloc.node,
        "client": _agent(fleet["tokens"][alloc.node.name]),
        "other": _agent(fleet["tokens"][other]),
    }
