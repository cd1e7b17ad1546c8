"""Placement with volumes (issue 27): a job that mounts a node-local volume runs on its node or
waits for it, saying so; the first placement binds a volume that has no node yet; a checkpoint
on a shared volume resumes on any node; deleted node-local volumes reach their node's agent."""

from __future__ import annotations

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job, JobState, Node
from storage.models import Volume, VolumeKind

pytestmark = pytest.mark.django_db


def submit(api, team, **fields):
    body = {
        "project": "alpha", "name": "v", "command": "true", "gpu_model": "H100-80GB-SXM",
        **fields,
    }  # fmt: skip
    resp = api(team["member"]).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return Job.objects.get(pk=resp.json()["id"])


def node_of(job: Job) -> set[str]:
    return set(Allocation.objects.filter(job=job).values_list("node__name", flat=True))


def local(team, name: str, node: str = "") -> Volume:
    return Volume.objects.create(
        project=team["a"], name=name, kind=VolumeKind.NODE_LOCAL, size_gib=1, node_name=node
    )


def test_a_job_runs_on_its_node_local_volumes_node(team, fleet, api):
    local(team, "cache", "h2")
    job = submit(api, team, volumes=[{"name": "cache"}])
    run_cycle()
    assert node_of(job) == {"h2"}


def test_a_job_waits_for_its_volumes_node_and_says_why(team, fleet, api):
    local(team, "ck", "h1")
    Node.objects.filter(name="h1").update(state=Node.State.DRAINING)
    job = submit(api, team, checkpoint="ck:run")
    run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and not node_of(job)
    assert "h1 draining" in job.pending_message
    assert "its checkpoint volume 'ck' is on that node" in job.pending_message
    detail = api(team["member"]).get(f"/api/v1/jobs/{job.pk}").json()
    assert "its checkpoint volume 'ck' is on that node" in detail["pending"]["message"]


def test_the_first_placement_binds_a_volume_with_no_node(team, fleet, api):
    cache = local(team, "cache")
    first = submit(api, team, volumes=[{"name": "cache"}])
    run_cycle()
    (where,) = node_of(first)
    cache.refresh_from_db()
    assert cache.node_name == where
    second = submit(api, team, volumes=[{"name": "cache"}], gpus=2)
    other = next(n for n in ("h1", "h2") if n != where)
    run_cycle()
    second.refresh_from_db()
    # the volume's node has one GPU left: it waits for it rather than taking the free node
    assert not node_of(second) and f"node {where}" in second.pending_message
    assert Allocation.objects.filter(node__name=other, ended_at__isnull=True).count() == 0


def test_volumes_on_two_nodes_are_refused_at_submit(team, fleet, api):
    local(team, "a", "h1")
    local(team, "b", "h2")
    body = {"project": "alpha", "name": "x", "command": "true",
            "volumes": [{"name": "a"}, {"name": "b"}]}  # fmt: skip
    resp = api(team["member"]).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 400 and "different nodes" in str(resp.json()["volumes"])


def test_a_shared_checkpoint_resumes_on_any_node(team, fleet, api, ckpt_volume):
    job = submit(api, team, checkpoint="ckpt:r", preemptible=True)
    run_cycle()
    (first,) = node_of(job)
    Node.objects.filter(name=first).update(state=Node.State.DRAINING)
    # its node is lost to it: it goes back to the queue and resumes elsewhere
    Allocation.objects.filter(job=job).update(ended_at=timezone.now(), end_reason="lost")
    Job.objects.filter(pk=job.pk).update(state=JobState.QUEUED, resume=True)
    run_cycle()
    again = set(
        Allocation.objects.filter(job=job, ended_at__isnull=True).values_list(
            "node__name", flat=True
        )
    )
    assert again and first not in again


def test_deleted_node_local_volumes_reach_their_agent(team, fleet, api):
    cache = local(team, "cache", "h1")
    api(team["owner"]).delete("/api/v1/projects/alpha/volumes/cache")
    cache.refresh_from_db()
    assert cache.state == "deleted"
    for name, expected in (("h1", [cache.pk]), ("h2", None)):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {fleet['tokens'][name]}")
        answer = client.post(
            "/api/agent/v1/heartbeat", {"telemetry": [], "running": []}, format="json"
        ).json()
        assert answer.get("deleted_volumes") == expected, name
