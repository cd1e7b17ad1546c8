"""A GPU fault credits usage only when corroborated: a later heartbeat still finds the GPU
unhealthy, or an operator confirms it. A forged XID in one heartbeat credits nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from billing import services
from billing.models import UsageRecord
from portal.models import AuditEvent
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Gpu, Job, JobState

pytestmark = pytest.mark.django_db


@pytest.fixture
def faulted(team, fleet, api):
    """A job that ran two hours on an H100, then its node heartbeat an XID 79 on that GPU."""
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "x", "command": "true", "gpu_model": "H100-80GB-SXM"},
        format="json",
    )
    job = Job.objects.get(pk=resp.json()["id"])
    run_cycle()
    alloc = Allocation.objects.get(job=job)
    Allocation.objects.filter(pk=alloc.pk).update(started_at=timezone.now() - timedelta(hours=2))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {fleet['tokens'][alloc.node.name]}")
    client.post(f"/api/agent/v1/jobs/{job.pk}/started", {"attempt": 1}, format="json")
    gpu = alloc.gpu
    forged = [
        {"uuid": gpu.uuid, "xid_events": [79], "age_s": 600},
        {"uuid": gpu.uuid, "xid_events": [79], "age_s": 0},  # the same heartbeat: no proof
    ]
    resp = client.post(
        "/api/agent/v1/heartbeat", {"telemetry": forged, "running": []}, format="json"
    )
    assert resp.status_code == 200
    return {"job": job, "alloc": alloc, "gpu": gpu, "client": client, "node": alloc.node}


def _credited(alloc: Allocation) -> set[bool]:
    return set(UsageRecord.objects.filter(allocation=alloc).values_list("fault_credit", flat=True))


def test_an_uncorroborated_xid_credits_nothing(faulted):
    alloc = Allocation.objects.get(pk=faulted["alloc"].pk)
    assert alloc.end_reason == "gpu_fault" and alloc.fault_corroborated_at is None
    assert Gpu.objects.get(pk=faulted["gpu"].pk).health == Gpu.Health.UNHEALTHY
    # the work is still moved off the GPU (this job may not restart: it fails)
    assert Job.objects.get(pk=faulted["job"].pk).state == JobState.FAILED
    result = services.usage_meter()
    assert result.credited == 0 and _credited(alloc) == {False}
    assert not AuditEvent.objects.filter(action="billing.usage.fault_credit").exists()


def test_a_later_heartbeat_that_still_finds_the_gpu_unhealthy_corroborates(faulted, settings):
    alloc, gpu = faulted["alloc"], faulted["gpu"]
    services.usage_meter()  # metered while not yet corroborated
    assert _credited(alloc) == {False}
    beat = {"telemetry": [{"uuid": gpu.uuid, "lost": True}], "running": []}
    faulted["client"].post("/api/agent/v1/heartbeat", beat, format="json")
    assert Allocation.objects.get(pk=alloc.pk).fault_corroborated_at is None  # too soon
    Gpu.objects.filter(pk=gpu.pk).update(fault_at=timezone.now() - timedelta(seconds=60))
    beat_ok = {"telemetry": [{"uuid": gpu.uuid, "utilization": 0}], "running": []}
    faulted["client"].post("/api/agent/v1/heartbeat", beat_ok, format="json")
    assert Allocation.objects.get(pk=alloc.pk).fault_corroborated_at is None  # healthy now
    faulted["client"].post("/api/agent/v1/heartbeat", beat, format="json")
    assert Allocation.objects.get(pk=alloc.pk).fault_corroborated_at is not None
    assert AuditEvent.objects.get(action="gpu.fault_corroborated").data["how"] == "heartbeat"
    result = services.usage_meter()
    assert result.credited == 1 and _credited(alloc) == {True}
    credit = AuditEvent.objects.get(action="billing.usage.fault_credit")
    assert credit.target_id == str(alloc.pk) and credit.data["corroborated_at"]


def test_an_operator_confirms_the_fault_on_the_node_page(faulted, make_user, team):
    alloc, node = faulted["alloc"], faulted["node"]
    researcher = Client()
    researcher.force_login(team["owner"])
    researcher.post(f"/ops/nodes/{node.pk}/confirm_faults/", {"confirm": node.name})
    assert Allocation.objects.get(pk=alloc.pk).fault_corroborated_at is None
    operator = make_user(staff=True)
    page = Client()
    page.force_login(operator)
    assert b"Confirm GPU faults" in page.get(f"/ops/nodes/{node.pk}/").content
    resp = page.post(f"/ops/nodes/{node.pk}/confirm_faults/", {"confirm": node.name})
    assert resp.status_code == 302
    assert Allocation.objects.get(pk=alloc.pk).fault_corroborated_at is not None
    event = AuditEvent.objects.get(action="gpu.fault_corroborated")
    assert event.actor_id == operator.pk and event.data["how"] == "operator"
    assert services.usage_meter().credited == 1 and _credited(alloc) == {True}
    assert AuditEvent.objects.filter(action="billing.usage.fault_credit").count() == 1


def test_an_operator_who_resets_health_without_confirming_credits_nothing(faulted, make_user):
    from scheduler.nodes import node_set_state

    node = faulted["node"]
    node_set_state(actor=make_user(staff=True), node=node, action="reset_health")
    assert services.usage_meter().credited == 0
    assert _credited(faulted["alloc"]) == {False}
