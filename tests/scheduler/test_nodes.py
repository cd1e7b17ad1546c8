"""Node health, loss, fencing, operator actions, provisioning and autoscaling."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import AuditEvent
from scheduler.cycle import run_cycle
from scheduler.models import (
    Allocation,
    Autoscaler,
    Gpu,
    Job,
    JobState,
    Node,
    NodeEvent,
)
from scheduler.nodes import lost_nodes_sweep, node_set_state
from scheduler.provisioning import autoscale

pytestmark = pytest.mark.django_db


def agent(token):
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


@pytest.fixture
def running(team, fleet, api, ckpt_volume):
    """One 1-GPU H100 job, placed and running."""
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {
            "project": "alpha",
            "name": "r",
            "command": "true",
            "gpu_model": "H100-80GB-SXM",
            "checkpoint": "ckpt:ck",
        },
        format="json",
    )
    job = Job.objects.get(pk=resp.json()["id"])
    run_cycle()
    alloc = Allocation.objects.get(job=job)
    client = agent(fleet["tokens"][alloc.node.name])
    client.post(f"/api/agent/v1/jobs/{job.pk}/started", {"attempt": 1}, format="json")
    return {"job": job, "alloc": alloc, "node": alloc.node, "gpu": alloc.gpu, "client": client}


def heartbeat(client, gpu, **sample):
    return client.post(
        "/api/agent/v1/heartbeat",
        {
            "telemetry": [{"uuid": gpu.uuid, "utilization": 90, "temperature_c": 60, **sample}],
            "running": [],
        },
        format="json",
    )


def test_register_reports_inventory_and_refuses_unknown_products(fleet):
    client = agent(fleet["tokens"]["h1"])
    gpus = list(fleet["nodes"]["h1"].gpus.order_by("index"))
    body = {
        "hostname": "h1",
        "driver_version": "550.54",
        "cuda_version": "12.4",
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
            for g in gpus
        ],
    }
    assert client.post("/api/agent/v1/register", body, format="json").status_code == 200
    node = Node.objects.get(name="h1")
    assert node.driver_version == "550.54" and node.gpus.filter(memory_mib=81559).count() == 2
    body["gpus"][0]["name"] = "NVIDIA B300"
    resp = client.post("/api/agent/v1/register", body, format="json")
    assert resp.status_code == 400 and "not in the catalog" in resp.json()["detail"]
    # a node cannot claim another node's GPU
    other = fleet["nodes"]["h2"].gpus.first()
    body["gpus"] = [{"index": 0, "uuid": other.uuid, "name": "H100-80GB-SXM", "memory_mib": 1}]
    assert client.post("/api/agent/v1/register", body, format="json").status_code == 409
    assert Gpu.objects.get(pk=other.pk).node.name == "h2"


def test_fatal_xid_marks_gpu_unhealthy_and_requeues_the_job(running):
    resp = heartbeat(running["client"], running["gpu"], xid_events=[79])
    assert resp.status_code == 200
    gpu = Gpu.objects.get(pk=running["gpu"].pk)
    assert gpu.health == Gpu.Health.UNHEALTHY
    job = Job.objects.get(pk=running["job"].pk)
    assert job.state == JobState.QUEUED and job.resume
    assert Allocation.objects.get(pk=running["alloc"].pk).end_reason == "gpu_fault"
    assert NodeEvent.objects.filter(kind="gpu_unhealthy", severity="critical").exists()
    run_cycle()
    new = Allocation.objects.get(job=job, ended_at__isnull=True)
    assert new.gpu_id != gpu.pk  # never placed back on the unhealthy GPU
    # healthy samples do not silently heal it; an operator resets it
    heartbeat(running["client"], running["gpu"])
    assert Gpu.objects.get(pk=gpu.pk).health == Gpu.Health.UNHEALTHY


def test_application_xid_fails_the_job_and_keeps_the_gpu(running):
    heartbeat(running["client"], running["gpu"], xid_events=[13])
    job = Job.objects.get(pk=running["job"].pk)
    assert job.state == JobState.FAILED and "XID 13" in job.failure_reason
    assert Gpu.objects.get(pk=running["gpu"].pk).health == Gpu.Health.HEALTHY


def test_thermal_slowdown_degrades_then_recovers(running):
    heartbeat(running["client"], running["gpu"], throttle_reasons=["hw_thermal_slowdown"])
    assert Gpu.objects.get(pk=running["gpu"].pk).health == Gpu.Health.DEGRADED
    assert Job.objects.get(pk=running["job"].pk).state == JobState.RUNNING
    heartbeat(running["client"], running["gpu"])
    assert Gpu.objects.get(pk=running["gpu"].pk).health == Gpu.Health.HEALTHY


def test_heartbeat_loss_requeues_on_another_node_and_the_node_is_fenced(running, fleet, settings):
    node = running["node"]
    Node.objects.update(last_heartbeat_at=timezone.now())
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=600)
    )
    assert lost_nodes_sweep() == [node.pk]
    job = Job.objects.get(pk=running["job"].pk)
    assert job.state == JobState.QUEUED
    assert list(job.events.values_list("to_state", flat=True))[-2:] == ["lost", "queued"]
    run_cycle()
    assert Allocation.objects.get(job=job, ended_at__isnull=True).node_id != node.pk
    # the node comes back: fenced, no assignments until it reports nothing running
    client = running["client"]
    resp = client.post(
        "/api/agent/v1/heartbeat",
        {"telemetry": [], "running": [{"job_id": job.pk, "attempt": 1, "pid": 7}]},
        format="json",
    )
    assert resp.json()["fenced"] is True
    assert client.get("/api/agent/v1/assignments").json() == {"fenced": True, "assignments": []}
    resp = client.post("/api/agent/v1/heartbeat", {"telemetry": [], "running": []}, format="json")
    assert resp.json()["fenced"] is False
    # its old attempt's exit report is refused
    stale = client.post(
        f"/api/agent/v1/jobs/{job.pk}/exited",
        {"attempt": 1, "exit_code": 0, "reason": "killed"},
        format="json",
    )
    assert stale.status_code == 409


def test_cordon_stops_placement_and_drain_preempts(running, team, api):
    operator = team["owner"]
    node = running["node"]
    node_set_state(actor=operator, node=node, action="cordon")
    assert AuditEvent.objects.filter(action="node.cordon").exists()
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {
            "project": "alpha",
            "name": "x",
            "command": "true",
            "gpus": 2,
            "gpu_model": "H100-80GB-SXM",
        },
        format="json",
    )
    run_cycle()
    alloc_nodes = set(
        Allocation.objects.filter(job_id=resp.json()["id"]).values_list("node_id", flat=True)
    )
    assert node.pk not in alloc_nodes
    node_set_state(actor=operator, node=node, action="drain")
    assert Job.objects.get(pk=running["job"].pk).state == JobState.PREEMPTING
    with pytest.raises(Exception, match="cannot cordon"):
        node_set_state(actor=operator, node=Node.objects.get(pk=node.pk), action="cordon")


def test_ops_pages_are_for_staff_only(running, team, client, make_user):
    client.force_login(team["member"])
    assert client.get("/ops/nodes/").status_code == 403
    node = running["node"]
    assert client.post(f"/ops/nodes/{node.pk}/cordon/", {"confirm": node.name}).status_code == 403
    client.force_login(make_user(staff=True))
    html = client.get("/ops/nodes/").content.decode()
    assert node.name in html
    detail = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    assert "Cordon" in detail and f"#{running['job'].pk}" in detail
    client.post(f"/ops/nodes/{node.pk}/cordon/", {"confirm": "wrong"})
    assert Node.objects.get(pk=node.pk).state == Node.State.READY
    client.post(f"/ops/nodes/{node.pk}/cordon/", {"confirm": node.name})
    assert Node.objects.get(pk=node.pk).state == Node.State.CORDONED
    assert client.get("/ops/pools/").status_code == 200


def test_autoscaler_scales_up_for_queued_work_and_down_when_idle(fleet, team, api):
    scaler = Autoscaler.objects.create(
        pool=fleet["pool"],
        gpu_model=fleet["l4"],
        gpus_per_node=4,
        min_nodes=0,
        max_nodes=3,
        warm_nodes=0,
        idle_ttl_s=60,
        provisioning_time_s=60,
    )
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "big", "command": "true", "gpus": 8, "gpu_model": "L4"},
        format="json",
    )
    run_cycle()
    job = Job.objects.get(pk=resp.json()["id"])
    assert job.state == JobState.QUEUED and job.pending_reason
    decisions = autoscale()
    assert decisions[0].action == "scale_up" and decisions[0].count == 2
    created = Node.objects.filter(autoscaler=scaler)
    assert created.count() == 2 and all(n.state == Node.State.PROVISIONING for n in created)
    assert all(n.agent_token_hash for n in created)
    # idle past the TTL: removed (never a busy node)
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    Node.objects.filter(autoscaler=scaler).update(
        state=Node.State.READY, created_at=timezone.now() - timedelta(hours=1)
    )
    decisions = autoscale()
    assert decisions[0].action == "scale_down" and decisions[0].count == 2
    assert Node.objects.filter(autoscaler=scaler, state=Node.State.RETIRED).count() == 2


def test_job_that_may_not_restart_fails_when_its_node_is_lost(team, fleet, api):
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "once", "command": "true", "gpu_model": "L4"},
        format="json",
    )
    run_cycle()
    Node.objects.update(last_heartbeat_at=timezone.now())
    Node.objects.filter(name="l1").update(  # the one L4 node, where the job runs, falls silent
        last_heartbeat_at=timezone.now() - timedelta(seconds=600)
    )
    lost_nodes_sweep()
    job = Job.objects.get(pk=resp.json()["id"])
    assert job.state == JobState.FAILED and "may not restart" in job.failure_reason


def test_latest_telemetry_is_the_newest_instant_of_a_batched_heartbeat(running):
    from scheduler.selectors import latest_telemetry

    gpu = running["gpu"]
    newest_first = [
        {"uuid": gpu.uuid, "utilization": 10, "age_s": 0},
        {"uuid": gpu.uuid, "utilization": 70, "age_s": 2},
        {"uuid": gpu.uuid, "utilization": 40, "age_s": 1},
    ]
    r = running["client"].post(
        "/api/agent/v1/heartbeat", {"telemetry": newest_first, "running": []}, format="json"
    )
    assert r.status_code == 200, r.content
    latest = latest_telemetry([gpu.pk])[gpu.pk]
    assert latest["utilization"] == 10
    r = running["client"].post(
        "/api/agent/v1/heartbeat",
        {
            "telemetry": [{**s, "utilization": s["utilization"] + 1} for s in newest_first[::-1]],
            "running": [],
        },
        format="json",
    )
    assert r.status_code == 200, r.content
    assert latest_telemetry([gpu.pk])[gpu.pk]["utilization"] == 11


def test_loss_sweep_holds_off_when_most_of_the_fleet_falls_silent_at_once(
    running, fleet, client, make_user
):
    from scheduler.models import GpuModel, Pool
    from scheduler.nodes import loss_storm
    from scheduler.seed import node_register_simulated

    for i in range(12):
        node_register_simulated(
            name=f"x{i}",
            pool=Pool.objects.get(name="default"),
            gpu_model=GpuModel.objects.get(name="H100-80GB-SXM"),
            gpu_count=1,
            cpu_milli=8000,
            memory_mib=64_000,
            state="ready",
        )
    long_ago = timezone.now() - timedelta(seconds=600)
    Node.objects.update(last_heartbeat_at=long_ago)  # 15 nodes silent: the portal's fault?
    Node.objects.filter(name__in=["x0", "x1"]).update(last_heartbeat_at=timezone.now())
    assert lost_nodes_sweep() == []
    assert not Node.objects.filter(state=Node.State.LOST).exists()
    assert Job.objects.get(pk=running["job"].pk).state == JobState.RUNNING
    assert loss_storm()["held"] == 13 and loss_storm()["watched"] == 15
    client.force_login(make_user(staff=True))
    html = client.get("/ops/nodes/").content.decode()
    assert "loss sweep held off" in html and "13 of 13 silent nodes" in html
    # heartbeats return except from three nodes: those three really are lost
    Node.objects.exclude(name__in=["h1", "h2", "l1"]).update(last_heartbeat_at=timezone.now())
    silent = set(Node.objects.filter(name__in=["h1", "h2", "l1"]).values_list("pk", flat=True))
    assert set(lost_nodes_sweep()) == silent
    assert loss_storm() is None
    assert Job.objects.get(pk=running["job"].pk).state == JobState.QUEUED
    assert "loss sweep held off" not in client.get("/ops/nodes/").content.decode()


def test_a_creeping_loss_stops_being_declared_once_most_of_the_pool_is_unhealthy(fleet):
    """Nodes fall silent a few at a time: the lost keep counting, so the pool's share of
    unhealthy nodes grows and the sweep stops declaring (a small pool: no secondary rate)."""
    from scheduler.models import GpuModel, Pool
    from scheduler.nodes import loss_storm
    from scheduler.seed import node_register_simulated

    pool = Pool.objects.get(name="default")
    for i in range(7):
        node_register_simulated(
            name=f"c{i}",
            pool=pool,
            gpu_model=GpuModel.objects.get(name="L4"),
            gpu_count=1,
            cpu_milli=8000,
            memory_mib=64_000,
            state="ready",
        )
    now = timezone.now()
    Node.objects.update(last_heartbeat_at=now)  # 10 nodes, all heard
    long_ago = now - timedelta(seconds=600)
    first = ["c0", "c1", "c2"]
    Node.objects.filter(name__in=first).update(last_heartbeat_at=long_ago)
    assert {Node.objects.get(pk=pk).name for pk in lost_nodes_sweep(now=now)} == set(first)
    # three more fall silent: 3 lost + 3 silent = 60 % of the pool is unhealthy
    Node.objects.filter(name__in=["c3", "c4", "c5"]).update(last_heartbeat_at=long_ago)
    assert lost_nodes_sweep(now=now + timedelta(seconds=10)) == []
    held = loss_storm()
    assert held["held"] == 3
    assert "no longer declared lost automatically" in held["messages"][0]
    assert set(Node.objects.filter(state=Node.State.LOST).values_list("name", flat=True)) == set(
        first
    )


def test_a_provisioned_agents_pid_joins_the_labels_its_registration_wrote_meanwhile(
    fleet, settings, tmp_path
):
    """Provisioning records the agent's pid after starting it; the agent may have registered
    in between and written its gang capability. Neither write undoes the other."""
    from scheduler.core.model import GANG_LABEL
    from scheduler.provisioning import AgentProcessProvider

    settings.PROVISIONING_SPAWN_AGENTS = True
    settings.BASE_DIR = tmp_path  # its log goes here; `-m agent` finds no agent here and exits
    stale = Node.objects.get(name="h1")  # read before the agent registered
    client = agent(fleet["tokens"]["h1"])
    gpus = list(stale.gpus.order_by("index"))
    body = {
        "hostname": "h1",
        "gang_members": False,
        "gang_members_reason": "no fence",
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": "H100-80GB-SXM", "memory_mib": 81559}
            for g in gpus
        ],
    }
    assert client.post("/api/agent/v1/register", body, format="json").status_code == 200
    assert GANG_LABEL not in stale.labels
    AgentProcessProvider()._spawn(stale, "token", {})
    stored = Node.objects.get(pk=stale.pk).labels
    assert stored == stale.labels  # the instance is told what was stored
    assert stored["agent_pid"].isdigit() and stored[GANG_LABEL] == "no"
