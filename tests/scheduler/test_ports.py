"""The scheduler's ports: each reaches the implementation registered for it, and a required
port nobody registered stops start-up (`manage.py check`) with a message naming it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from rest_framework.test import APIClient

from billing import admission as billing_admission
from billing import selectors as billing_selectors
from monitoring import ingest, metrics
from scheduler import ports
from scheduler.admission import ADMISSION_CHECKS, Verdict
from scheduler.estimates import quote, shares_cost_per_hour
from scheduler.models import Allocation, GpuModel, Job
from scheduler.tasks import scheduling_cycle


def test_each_port_holds_the_implementation_its_app_registers():
    assert ports.PRICE_QUOTE.get() is billing_selectors.rates_now
    assert ports.SHARES_COST.get() is billing_selectors.shares_cost_per_hour
    assert ports.JOB_COST.get() is billing_selectors.job_cost
    assert ports.BUDGET_GATE.get() is billing_admission.projects_over_budget
    assert ports.RESERVED_CAPACITY.get() is billing_selectors.reserved_gpus_by_project
    assert list(ADMISSION_CHECKS) == [billing_admission.budget_check]
    assert list(ports.TELEMETRY_SINKS) == [ingest.ingest_samples]
    assert list(ports.ALLOCATION_LISTENERS) == [ingest.allocations_changed]
    assert list(ports.CYCLE_LISTENERS) == [metrics.cycle_ended]
    assert ports.check_required_ports() == []


@pytest.mark.parametrize("port", ports.PORTS, ids=lambda p: p.name)
def test_a_missing_required_port_fails_the_start_up_checks(port):
    with port.override(None):
        errors = ports.check_required_ports()
        assert [e.id for e in errors] == ["scheduler.E001"]
        assert port.name in errors[0].msg and port.provider in errors[0].msg
        with pytest.raises(SystemCheckError, match=port.name):
            call_command("check")
        with pytest.raises(ImproperlyConfigured, match=port.name):
            port.get()
    call_command("check")  # registered again: start-up passes


class Spy:
    def __init__(self, answer=None):
        self.calls: list[dict] = []
        self.answer = answer

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        return self.answer


@pytest.mark.django_db
def test_the_price_ports_answer_the_dry_run(fleet):
    from scheduler.admission import JobSpec

    l4 = GpuModel.objects.get(name="L4")
    rate, shares = Spy({l4.pk: Decimal("7")}), Spy(Decimal("3.333"))
    with ports.PRICE_QUOTE.override(rate), ports.SHARES_COST.override(shares):
        spec = JobSpec(name="x", command="true", gpus=2, gpu_model=l4)
        assert quote(spec)[:2] == (Decimal("7"), Decimal("14.00"))
        assert shares_cost_per_hour([(l4, 250)], preemptible=True) == Decimal("3.33")
    assert rate.calls == [{"gpu_models": [l4], "preemptible": False}]
    assert shares.calls == [{"shares": [(l4, 250)], "preemptible": True}]


@pytest.mark.django_db
def test_the_cycle_asks_the_budget_and_reserved_ports_and_tells_the_listeners(team, fleet, api):
    resp = api(team["member"]).post(
        "/api/v1/jobs", {"project": "alpha", "name": "x", "command": "true"}, format="json"
    )
    job = Job.objects.get(pk=resp.json()["id"])
    gate, reserved, moved, ended = Spy({job.project_id}), Spy({}), Spy(), Spy()
    with (
        ports.BUDGET_GATE.override(gate),
        ports.RESERVED_CAPACITY.override(reserved),
        ports.ALLOCATION_LISTENERS.override([moved]),
        ports.CYCLE_LISTENERS.override([ended]),
    ):
        scheduling_cycle.apply()
        assert not Allocation.objects.filter(job=job).exists()  # its project is over budget
        gate.answer = set()
        scheduling_cycle.apply()
    assert gate.calls[0] == {"project_ids": {job.project_id}}
    assert reserved.calls and "now" in reserved.calls[0]
    alloc = Allocation.objects.get(job=job)
    assert moved.calls == [{"node_ids": {alloc.node_id}}]
    assert [c["placed"] for c in ended.calls] == [0, 1]


@pytest.mark.django_db
def test_admission_asks_every_registered_check(team, fleet, api):
    refuse = Spy(Verdict(False, reason="Spy says no."))
    with ADMISSION_CHECKS.override([refuse]):
        resp = api(team["member"]).post(
            "/api/v1/jobs", {"project": "alpha", "name": "x", "command": "true"}, format="json"
        )
    job = Job.objects.get(pk=resp.json()["id"])
    assert job.state == "rejected" and job.failure_reason == "Spy says no."
    assert refuse.calls[0]["project"].slug == "alpha"


@pytest.mark.django_db
def test_heartbeat_telemetry_reaches_the_sinks(fleet):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {fleet['tokens']['h1']}")
    gpu = fleet["nodes"]["h1"].gpus.order_by("index").first()
    sink = Spy()
    with ports.TELEMETRY_SINKS.override([sink]):
        resp = client.post(
            "/api/agent/v1/heartbeat",
            {"telemetry": [{"uuid": gpu.uuid, "utilization": 90}], "running": []},
            format="json",
        )
    assert resp.status_code == 200, resp.content
    assert [s["gpu_id"] for s in sink.calls[0]["samples"]] == [gpu.pk]
