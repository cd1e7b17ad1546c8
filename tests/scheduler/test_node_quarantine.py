"""The portal trusts a node's hardware once: other hardware on a later registration puts the
node in quarantine, where nothing is placed on it, until an operator approves it."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from portal.models import AuditEvent
from scheduler.cycle import run_cycle
from scheduler.models import Gpu, Job, JobState, Node, NodeEvent
from scheduler.nodes import lost_nodes_sweep, node_heartbeat

pytestmark = pytest.mark.django_db

REGISTER = "/api/agent/v1/register"


def agent(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


def inventory(node: Node, *, name: str = "NVIDIA H100 80GB HBM3", count: int | None = None):
    gpus = list(node.gpus.order_by("index"))
    if count is None:
        rows = [(g.index, g.uuid) for g in gpus]
    else:
        rows = [(i, f"GPU-forged-{node.pk}-{i}") for i in range(count)]
    memory = 143771 if "H200" in name else 81559
    return {
        "hostname": node.name,
        "cpu_milli": 64_000,
        "memory_mib": 512_000,
        "gpus": [{"index": i, "uuid": u, "name": name, "memory_mib": memory} for i, u in rows],
    }


@pytest.fixture
def registered(fleet):
    """h1 and h2 as their agents first registered them (2 × H100 each)."""
    clients = {}
    for name in ("h1", "h2"):
        clients[name] = agent(fleet["tokens"][name])
        node = fleet["nodes"][name]
        assert clients[name].post(REGISTER, inventory(node), format="json").status_code == 200
    return clients


def test_re_registering_as_64_h200_quarantines_the_node_and_nothing_lands_on_it(
    fleet, registered, team, api, django_capture_on_commit_callbacks
):
    h1 = fleet["nodes"]["h1"]
    forged = inventory(h1, name="NVIDIA H200", count=64)
    resp = registered["h1"].post(REGISTER, forged, format="json")
    assert resp.status_code == 200  # the agent is not told more than that it registered
    h1.refresh_from_db()
    assert h1.state == Node.State.QUARANTINED
    assert h1.pending_inventory["gpus"][0]["name"] == "NVIDIA H200"
    # the forged GPUs do not exist for the portal: the node keeps its two H100 slots
    assert list(h1.gpus.values_list("model__name", flat=True)) == ["H100-80GB-SXM"] * 2
    event = NodeEvent.objects.get(node=h1, kind="node_quarantined")
    assert "64 × H200-141GB" in event.message and event.severity == "critical"
    audit = AuditEvent.objects.get(action="node.quarantine", target_id=str(h1.pk))
    assert audit.data["reported"]["gpus"][63][1] == "H200-141GB"

    # h2 does the same; H100 jobs then find no node: nothing is placed on a quarantined node
    registered["h2"].post(REGISTER, inventory(fleet["nodes"]["h2"], count=4), format="json")
    with django_capture_on_commit_callbacks(execute=True):
        resp = api(team["member"]).post(
            "/api/v1/jobs",
            {"project": "alpha", "name": "v", "command": "true", "gpu_model": "H100-80GB-SXM"},
            format="json",
        )
        run_cycle()
    job = Job.objects.get(pk=resp.json()["id"])
    assert job.state == JobState.QUEUED and not job.allocations.exists()


def test_an_operator_approves_the_new_inventory_on_the_node_page(fleet, registered, make_user):
    h1 = fleet["nodes"]["h1"]
    registered["h1"].post(REGISTER, inventory(h1, count=4), format="json")  # 4 × H100 now
    operator = make_user(staff=True)
    page = Client()
    page.force_login(operator)
    detail = page.get(f"/ops/nodes/{h1.pk}/")
    assert b"Approve inventory" in detail.content and b"quarantined" in detail.content
    resp = page.post(f"/ops/nodes/{h1.pk}/approve_inventory/", {"confirm": h1.name})
    assert resp.status_code == 302
    h1.refresh_from_db()
    assert h1.state == Node.State.READY and h1.pending_inventory is None
    assert h1.gpus.count() == 4 and h1.registered_inventory["gpus"][3][0] == 3
    audit = AuditEvent.objects.get(action="node.approve_inventory", target_id=str(h1.pk))
    assert audit.actor_id == operator.pk
    # the approved inventory is the registered one now: the same again is no difference
    assert registered["h1"].post(REGISTER, inventory(h1), format="json").status_code == 200
    h1.refresh_from_db()
    assert h1.state == Node.State.READY


def test_a_researcher_cannot_approve(fleet, registered, team):
    h1 = fleet["nodes"]["h1"]
    registered["h1"].post(REGISTER, inventory(h1, count=4), format="json")
    page = Client()
    page.force_login(team["owner"])
    resp = page.post(f"/ops/nodes/{h1.pk}/approve_inventory/", {"confirm": h1.name})
    assert resp.status_code in (302, 403)
    h1.refresh_from_db()
    assert h1.state == Node.State.QUARANTINED


def test_the_admin_action_approves_too(fleet, registered, make_user):
    h1 = fleet["nodes"]["h1"]
    registered["h1"].post(REGISTER, inventory(h1, count=1), format="json")
    admin = make_user(staff=True)
    admin.is_superuser = True
    admin.save()
    page = Client()
    page.force_login(admin)
    resp = page.post(
        "/admin/scheduler/node/",
        {"action": "approve_inventory", "_selected_action": [h1.pk]},
    )
    assert resp.status_code == 302
    h1.refresh_from_db()
    assert h1.state == Node.State.READY and h1.gpus.exclude(health="unhealthy").count() == 1
    assert AuditEvent.objects.filter(action="node.approve_inventory", actor=admin).exists()


def test_a_replaced_gpu_of_the_same_model_is_no_difference(fleet, registered):
    h1 = fleet["nodes"]["h1"]
    body = inventory(h1)
    body["gpus"][0]["uuid"] = "GPU-new-device-0"
    assert registered["h1"].post(REGISTER, body, format="json").status_code == 200
    h1.refresh_from_db()
    assert h1.state == Node.State.READY
    assert Gpu.objects.filter(node=h1, uuid="GPU-new-device-0").exists()


def test_a_quarantined_node_lost_and_back_stays_quarantined(fleet, registered, settings):
    from datetime import timedelta

    from django.utils import timezone

    h1 = fleet["nodes"]["h1"]
    registered["h1"].post(REGISTER, inventory(h1, count=4), format="json")
    Node.objects.filter(pk=h1.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert h1.pk in lost_nodes_sweep()
    h1.refresh_from_db()
    assert h1.state == Node.State.LOST
    node_heartbeat(node_id=h1.pk, token_hash=h1.agent_token_hash, telemetry=[], running=[])
    h1.refresh_from_db()
    assert h1.state == Node.State.QUARANTINED
