"""Health rules and autoscaler decisions, table-driven."""

from __future__ import annotations

import pytest

from scheduler.autoscale_rules import NodeInfo, ScalerInput, decide
from scheduler.gpu_health_rules import Verdict, assess

HEALTHY = {"utilization": 80, "temperature_c": 60, "xid_events": [], "ecc_uncorrected": 0}


@pytest.mark.parametrize(
    ("sample", "verdict", "reason_part", "job_fault"),
    [
        (HEALTHY, Verdict.HEALTHY, None, ()),
        ({**HEALTHY, "lost": True}, Verdict.UNHEALTHY, "lost", ()),
        ({**HEALTHY, "xid_events": [79]}, Verdict.UNHEALTHY, "XID 79", ()),
        ({**HEALTHY, "xid_events": [48]}, Verdict.UNHEALTHY, "XID 48", ()),
        ({**HEALTHY, "xid_events": [95]}, Verdict.UNHEALTHY, "XID 95", ()),
        ({**HEALTHY, "xid_events": [74]}, Verdict.UNHEALTHY, "XID 74", ()),
        ({**HEALTHY, "xid_events": [119, 120]}, Verdict.UNHEALTHY, "XID 119, 120", ()),
        ({**HEALTHY, "ecc_uncorrected": 2}, Verdict.UNHEALTHY, "uncorrected ECC", ()),
        ({**HEALTHY, "row_remap_pending": True}, Verdict.UNHEALTHY, "row remapping", ()),
        ({**HEALTHY, "temperature_c": 88}, Verdict.UNHEALTHY, "shutdown threshold", ()),
        ({**HEALTHY, "xid_events": [13]}, Verdict.HEALTHY, None, (13,)),
        ({**HEALTHY, "xid_events": [31, 43]}, Verdict.HEALTHY, None, (31, 43)),
        ({**HEALTHY, "throttle_reasons": ["hw_thermal_slowdown"]}, Verdict.DEGRADED, "thermal", ()),
        ({**HEALTHY, "throttle_reasons": ["sw_power_cap"]}, Verdict.HEALTHY, None, ()),
        ({"utilization": None, "temperature_c": None}, Verdict.HEALTHY, None, ()),
    ],
)
def test_health_rules(sample, verdict, reason_part, job_fault):
    result = assess(sample)
    assert result.gpu == verdict
    assert result.job_fault_xids == job_fault
    if reason_part:
        assert any(reason_part in r for r in result.reasons), result.reasons


def test_shutdown_threshold_is_per_gpu():
    assert assess({**HEALTHY, "temperature_c": 80}, shutdown_temp_c=84).gpu == Verdict.UNHEALTHY
    assert assess({**HEALTHY, "temperature_c": 80}, shutdown_temp_c=100).gpu == Verdict.HEALTHY


def nodes(*specs: tuple[str, bool, float]) -> tuple[NodeInfo, ...]:
    return tuple(
        NodeInfo(f"n{i}", state, busy, idle) for i, (state, busy, idle) in enumerate(specs)
    )


BASE = {
    "min_nodes": 0,
    "max_nodes": 4,
    "warm_nodes": 1,
    "gpus_per_node": 8,
    "provisioning_time_s": 120,
    "idle_ttl_s": 600,
    "unplaceable_gpus": 0,
    "frees_in_s": None,
}


@pytest.mark.parametrize(
    ("overrides", "fleet", "action", "count"),
    [
        ({"min_nodes": 2}, nodes(), "scale_up", 2),
        ({}, nodes(), "scale_up", 1),  # warm pool of one
        ({}, nodes(("ready", False, 10)), "hold", 0),
        ({"unplaceable_gpus": 12}, nodes(("ready", True, 0)), "scale_up", 2),
        (
            {"unplaceable_gpus": 12},
            nodes(("provisioning", False, 0), ("ready", True, 0)),
            "scale_up",
            1,
        ),
        ({"unplaceable_gpus": 8, "frees_in_s": 30}, nodes(("ready", True, 0)), "hold", 0),
        ({"unplaceable_gpus": 8, "frees_in_s": 600}, nodes(("ready", True, 0)), "scale_up", 1),
        (
            {"unplaceable_gpus": 40, "max_nodes": 2},
            nodes(("ready", True, 0), ("ready", True, 0)),
            "hold",
            0,
        ),
        ({"unplaceable_gpus": 40, "max_nodes": 3}, nodes(("ready", True, 0)), "scale_up", 2),
        (
            {},
            nodes(("ready", False, 700), ("ready", False, 900), ("ready", True, 0)),
            "scale_down",
            1,
        ),
        ({"warm_nodes": 0}, nodes(("ready", False, 700), ("ready", False, 900)), "scale_down", 2),
        (
            {"warm_nodes": 0, "min_nodes": 2},
            nodes(("ready", False, 700), ("ready", False, 900)),
            "hold",
            0,
        ),
        ({"warm_nodes": 0}, nodes(("ready", False, 100)), "hold", 0),
        ({"warm_nodes": 0}, nodes(("ready", True, 10_000)), "hold", 0),  # never a busy node
    ],
)
def test_autoscaler_decisions(overrides, fleet, action, count):
    decision = decide(ScalerInput(**{**BASE, **overrides, "nodes": fleet}))
    assert (decision.action, decision.count) == (action, count), decision.reason
    assert decision.reason
    if action == "scale_down":
        assert len(decision.remove) == count
        busy = {n.name for n in fleet if n.busy}
        assert not busy & set(decision.remove)
        # the longest idle go first
        idle = sorted((n for n in fleet if not n.busy), key=lambda n: -n.idle_for_s)
        assert decision.remove[0] == idle[0].name
