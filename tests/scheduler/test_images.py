"""Operators curate the images the form offers and the registries images may come from;
warm nodes are told which images to keep pulled; a missing image bills nothing."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from billing import services as billing
from billing.models import UsageRecord
from scheduler.images import image_registry
from scheduler.models import Allocation, AllowedRegistry, CuratedImage, Job, JobState

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("reference", "registry"),
    [
        ("busybox", "docker.io"),
        ("library/ubuntu:24.04", "docker.io"),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io"),
        ("registry.example.org:5000/team/img@sha256:" + "a" * 64, "registry.example.org:5000"),
        ("localhost/gpucloud-job:1", "localhost"),
        ("quay.io/evil/miner", "quay.io"),
    ],
)
def test_the_registry_an_image_names(reference, registry):
    assert image_registry(reference) == registry


def _job(image: str) -> dict:
    return {"project": "alpha", "name": "img", "command": "true", "image": image}


def test_an_image_from_a_registry_not_allowed_is_refused_naming_it(team, api, fleet):
    resp = api(team["member"]).post("/api/v1/jobs", _job("quay.io/evil/miner:1"), format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert "image" in body["fields"] and "'quay.io'" in body["message"]
    assert "quay.io/evil/miner:1" in body["message"]
    assert not Job.objects.exists()
    ok = api(team["member"]).post(
        "/api/v1/jobs", _job("nvcr.io/nvidia/pytorch:24.05-py3"), format="json"
    )
    assert ok.status_code == 201
    # an operator allows the registry: the same image is accepted
    AllowedRegistry.objects.create(host="quay.io")
    again = api(team["member"]).post("/api/v1/jobs", _job("quay.io/evil/miner:1"), format="json")
    assert again.status_code == 201


def test_the_form_refuses_it_too_and_offers_the_curated_images(team, fleet):
    CuratedImage.objects.create(
        reference="nvcr.io/nvidia/pytorch:24.05-py3",
        name="PyTorch (NGC 24.05)",
        cuda_version="12.4",
        framework="PyTorch",
        framework_version="2.4",
    )
    CuratedImage.objects.create(reference="docker.io/old/img:1", name="Retired", is_active=False)
    page = Client()
    page.force_login(team["member"])
    form = page.get("/jobs/new/").content.decode()
    assert "PyTorch (NGC 24.05)" in form and "CUDA 12.4" in form and "PyTorch 2.4" in form
    assert "nvcr.io/nvidia/pytorch:24.05-py3" in form and "Retired" not in form
    post = {
        "project": "alpha",
        "name": "f",
        "command": "true",
        "shape": "whole",
        "gpus": "1",
        "priority": "1",
        "image": "quay.io/evil/miner:1",
    }
    refused = page.post("/jobs/new/", post)
    assert refused.status_code == 400 and "quay.io" in refused.content.decode()
    assert not Job.objects.exists()
    assert (
        page.post("/jobs/new/", {**post, "image": "nvcr.io/nvidia/pytorch:24.05-py3"}).status_code
        == 302
    )
    assert Job.objects.get().image == "nvcr.io/nvidia/pytorch:24.05-py3"


def test_heartbeats_tell_nodes_which_images_to_keep_pulled(fleet):
    CuratedImage.objects.create(reference="nvcr.io/nvidia/pytorch:24.05-py3", name="PyTorch")
    CuratedImage.objects.create(reference="docker.io/old/img:1", name="Old", is_active=False)
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {fleet['tokens']['h1']}")
    answer = agent.post(
        "/api/agent/v1/heartbeat", {"telemetry": [], "running": []}, format="json"
    ).json()
    assert answer["images"] == ["nvcr.io/nvidia/pytorch:24.05-py3"]


def test_an_image_that_does_not_exist_fails_the_job_naming_it_and_bills_nothing(placed):
    client, job = placed["client"], placed["job"]
    message = "image 'localhost/nope:1' not found on this node (images are not pulled at start)"
    report = {
        "kind": "exited",
        "job_id": job.pk,
        "attempt": 1,
        "exit_code": None,
        "reason": "failed_to_start",
        "message": message,
    }
    client.post("/api/agent/v1/sync", {"reports": [report]}, format="json")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "localhost/nope:1" in job.failure_reason
    alloc = Allocation.objects.get(job=job)
    assert alloc.ended_at == alloc.started_at  # it never ran
    billing.usage_meter()
    assert sum(r.amount for r in UsageRecord.objects.filter(job=job)) == 0
