"""Fast path: plain parsers for the agents' two most frequent requests, beside their serializers.

Justified by `bench.agent_requests` (docs/benchmarks.md, "Agent requests"), which times each
request with and without them, and by `bench.submit_throughput` (the agents' syncs share the
web workers with the submissions). Each parser answers exactly what its serializer
(`scheduler.agent_api.serializers`) would make of a request as agents send it, and returns
None for anything else, which the serializer then parses and, if need be, explains. The
property tests in tests/scheduler/test_heartbeat_parse.py and test_agent_gate.py hold them to it.

- `idle_sync`: a sync without reports, the agents' most frequent request (every poll).
- `plain_heartbeat`: a heartbeat, dozens of samples every few seconds per node; building a
  serializer per sample was half of the heartbeat's CPU.
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

from agent.protocol import MAX_HEARTBEAT_RUNNING, MAX_HEARTBEAT_SAMPLES, MAX_SAMPLE_PROCESSES
from scheduler.agent_api.serializers import (
    INT32_MAX,
    INT64_MAX,
    ProcessSerializer,
    RunningSerializer,
    TelemetrySerializer,
)

_SYNC_FIELDS = frozenset({"version", "reports", "assignments"})
_SYNC_VERSION = re.compile(r"[0-9a-f]{1,64}")


def idle_sync(data: Any) -> dict[str, Any] | None:
    """What `SyncSerializer` makes of a sync without reports, found without building one (the
    agents' most frequent request); None for anything else, which the serializer parses."""
    if not isinstance(data, dict) or not data.keys() <= _SYNC_FIELDS:
        return None
    version, assignments = data.get("version"), data.get("assignments", True)
    if data.get("reports", []) != [] or not isinstance(assignments, bool):
        return None
    if version is not None and not (
        isinstance(version, str) and (version == "" or _SYNC_VERSION.fullmatch(version))
    ):
        return None
    parsed: dict[str, Any] = {"reports": [], "assignments": assignments}
    if "version" in data:
        parsed["version"] = version
    return parsed


_NUMBER_RANGES = {"utilization": (0, 100), "temperature_c": (-50, 200), "power_w": (0, 5000)}
_TELEMETRY_FIELDS = frozenset(TelemetrySerializer._declared_fields)
_RUNNING_FIELDS = frozenset(RunningSerializer._declared_fields)
_PROCESS_FIELDS = frozenset(ProcessSerializer._declared_fields)


def _count(value: Any) -> TypeGuard[int]:
    return type(value) is int and 0 <= value <= INT64_MAX


def _plain_text(value: Any, max_length: int, *, blank: bool) -> bool:
    """A string DRF's CharField keeps as it is (ASCII, nothing to trim, no NUL)."""
    return (
        type(value) is str
        and (blank or value != "")
        and len(value) <= max_length
        and value.isascii()
        and "\x00" not in value
    )


def _plain_telemetry(record: Any) -> dict[str, Any] | None:
    """What `TelemetrySerializer` makes of one sample, or None where it might differ."""
    if type(record) is not dict or not record.keys() <= _TELEMETRY_FIELDS:
        return None
    uuid = record.get("uuid")
    if not _plain_text(uuid, 64, blank=False):
        return None
    out: dict[str, Any] = {"uuid": uuid}
    for name, (low, high) in _NUMBER_RANGES.items():
        if name in record:
            value = record[name]
            if value is not None and not (type(value) in (int, float) and low <= value <= high):
                return None
            out[name] = None if value is None else float(value)
    for name in ("memory_used_mib", "ecc_uncorrected"):
        if name in record:
            if record[name] is not None and not _count(record[name]):
                return None
            out[name] = record[name]
    if "row_remap_pending" in record:
        pending = record["row_remap_pending"]
        if pending is not None and type(pending) is not bool:  # 0 == False, yet DRF says False
            return None
        out["row_remap_pending"] = pending
    if "xid_events" in record:
        xids = record["xid_events"]
        if type(xids) is not list or len(xids) > 100 or not all(_count(x) for x in xids):
            return None
        out["xid_events"] = list(xids)
    if "throttle_reasons" in record:
        reasons = record["throttle_reasons"]
        if type(reasons) is not list or len(reasons) > 32:
            return None
        if not all(_plain_text(r, 64, blank=True) and r == r.strip() for r in reasons):
            return None
        out["throttle_reasons"] = list(reasons)
    if "processes" in record:
        processes = []
        listed = record["processes"]
        if type(listed) is list and len(listed) > MAX_SAMPLE_PROCESSES:
            return None
        for process in listed if type(listed) is list else [None]:
            if type(process) is not dict or not process.keys() <= _PROCESS_FIELDS:
                return None
            if not _count(process.get("pid")):
                return None
            used = process.get("used_memory_mib", 0)
            if used is not None and not _count(used):
                return None
            processes.append(dict(process))
        out["processes"] = processes
    lost = record.get("lost", False)
    if type(lost) is not bool:
        return None
    out["lost"] = lost
    if "age_s" in record:
        age = record["age_s"]
        if not (type(age) in (int, float) and 0 <= age <= 600):
            return None
        out["age_s"] = float(age)
    return out


def plain_heartbeat(data: Any) -> dict[str, Any] | None:
    """What `HeartbeatSerializer` makes of a heartbeat as agents send it, found without
    building a serializer per sample (a node sends 40 of them every few seconds); None for
    anything else, which the serializer parses and, if need be, explains."""
    if type(data) is not dict or data.keys() != {"telemetry", "running"}:
        return None
    telemetry, running = data["telemetry"], data["running"]
    if type(telemetry) is not list or len(telemetry) > MAX_HEARTBEAT_SAMPLES:
        return None
    if type(running) is not list or len(running) > MAX_HEARTBEAT_RUNNING:
        return None
    samples = []
    for record in telemetry:
        sample = _plain_telemetry(record)
        if sample is None:
            return None
        samples.append(sample)
    attempts = []
    for entry in running:
        if type(entry) is not dict or not entry.keys() <= _RUNNING_FIELDS:
            return None
        job_id, attempt, pid = entry.get("job_id"), entry.get("attempt"), entry.get("pid", 0)
        if not (_count(job_id) and job_id >= 1 and _count(attempt) and attempt <= INT32_MAX):
            return None
        if pid is not None and not _count(pid):
            return None
        attempts.append(dict(entry))
    return {"telemetry": samples, "running": attempts}
