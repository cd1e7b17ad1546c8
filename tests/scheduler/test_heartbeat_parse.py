"""The heartbeat's plain parser agrees with HeartbeatSerializer wherever it answers.

Agents send a heartbeat every few seconds with dozens of samples; building a serializer per
sample was half of the heartbeat's CPU. `_plain_heartbeat` parses what agents send and leaves
everything else (odd types, out of range, unknown fields) to the serializer, which explains
what is wrong. Compared as JSON text, so that 50 and 50.0 count as different answers.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.gpus import TELEMETRY_KEYS, SimulatedBackend
from scheduler.agent_api.fastparse import plain_heartbeat as _plain_heartbeat
from scheduler.agent_api.serializers import HeartbeatSerializer

_odd = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0.5, 99.9, 100, 101, 600.0, 601, -51, 2**63, 1e308, float("nan")])
    | st.text(max_size=3)
    | st.sampled_from(["", " x", "x\x00", "é", "GPU-1", "x" * 65, "true"])
    | st.just([])
)
_count = st.integers(0, 2**63 - 1)


def _number(low: int, high: int) -> st.SearchStrategy[Any]:
    return st.integers(low, high) | st.floats(low, high)


# Heartbeats as agents send them: every value in range, so the plain parser answers and the
# property below has something to compare. `_heartbeats` then spoils some of them.
_plain_sample = st.fixed_dictionaries(
    {"uuid": st.sampled_from(["GPU-1", "GPU-2", "GPU-abc-123", "x" * 64])},
    optional={
        "utilization": st.none() | _number(0, 100),
        "memory_used_mib": st.none() | _count,
        "temperature_c": st.none() | _number(-50, 200),
        "power_w": st.none() | _number(0, 5000),
        "ecc_uncorrected": st.none() | _count,
        "row_remap_pending": st.none() | st.booleans(),
        "xid_events": st.lists(_count, max_size=3),
        "throttle_reasons": st.lists(
            st.sampled_from(["", "HW_SLOWDOWN", "sw_power_cap"]), max_size=3
        ),
        "processes": st.lists(
            st.fixed_dictionaries(
                {"pid": _count}, optional={"used_memory_mib": st.none() | _count}
            ),
            max_size=2,
        ),
        "lost": st.booleans(),
        "age_s": _number(0, 600),
    },
)
_plain_running = st.fixed_dictionaries(
    {"job_id": st.integers(1, 2**63 - 1), "attempt": _count},
    optional={"pid": st.none() | _count},
)
_plain_heartbeats = st.fixed_dictionaries(
    {
        "telemetry": st.lists(_plain_sample, max_size=3),
        "running": st.lists(_plain_running, max_size=2),
    }
)


@st.composite
def _spoiled(draw: st.DrawFn) -> Any:
    """A plain heartbeat with one value replaced by an odd one (or one unknown field added)."""
    body = draw(_plain_heartbeats)
    records = [*body["telemetry"], *body["running"]]
    if not records:
        return dict(body, other=draw(_odd))
    record = draw(st.sampled_from(records))
    record[draw(st.sampled_from([*record, "other"]))] = draw(_odd)
    return body


_heartbeats = _plain_heartbeats | _spoiled()


def as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True)


def serializer_answer(body: Any) -> Any:
    serializer = HeartbeatSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    return json.loads(json.dumps(serializer.validated_data))  # nested OrderedDicts to dicts


def test_the_plain_parser_agrees_with_the_serializer():
    compared: list[Any] = []

    @settings(max_examples=600, deadline=None, database=None)
    @given(_heartbeats)
    def check(body: Any) -> None:
        parsed = _plain_heartbeat(body)
        if parsed is None:
            return  # the serializer's to decide (and to explain)
        compared.append(body)
        assert as_json(parsed) == as_json(serializer_answer(body))

    check()
    # Most examples reach the comparison: a generator the parser always declines proves nothing.
    assert len(compared) >= 200, len(compared)  # about half do; a third at least
    # ...and they are not all alike: empty heartbeats, samples, running jobs.
    assert any(b["telemetry"] for b in compared) and any(b["running"] for b in compared)
    assert any(not b["telemetry"] and not b["running"] for b in compared)


def test_it_parses_what_the_agent_sends():
    backend = SimulatedBackend("8xH100-80GB-SXM", hostname="n1", seed=3)
    busy = backend.sample(set())[0]["uuid"]  # one GPU runs a job's process
    samples = [
        {**{k: record.get(k) for k in TELEMETRY_KEYS}, "age_s": age}  # as agent.main sends
        for age in (4, 3, 2, 1, 0)
        for record in backend.sample({busy}, {busy: [4242]})
    ]
    body = {"telemetry": samples, "running": [{"job_id": 7, "attempt": 1, "pid": 4242}]}
    parsed = _plain_heartbeat(json.loads(json.dumps(body)))
    assert parsed is not None and len(parsed["telemetry"]) == 40
    assert as_json(parsed) == as_json(serializer_answer(body))


def test_it_leaves_the_odd_ones_to_the_serializer():
    ok = {"uuid": "GPU-1", "utilization": 50}
    assert _plain_heartbeat({"telemetry": [ok], "running": []}) is not None
    for odd in [
        {"telemetry": [ok]},  # running missing
        {"telemetry": [dict(ok, utilization=True)], "running": []},  # a bool is no number
        {"telemetry": [dict(ok, row_remap_pending=0)], "running": []},  # 0 is no bool (DRF: False)
        {"telemetry": [dict(ok, row_remap_pending=1)], "running": []},
        {"telemetry": [dict(ok, utilization=101)], "running": []},
        {"telemetry": [dict(ok, uuid="")], "running": []},
        {"telemetry": [dict(ok, gpu="x")], "running": []},  # unknown field
        {"telemetry": [ok], "running": [{"job_id": 0, "attempt": 1}]},
        {"telemetry": [ok], "running": [], "extra": 1},
        [ok],
    ]:
        assert _plain_heartbeat(odd) is None, odd
