"""Health rules: what NVML signals mean for a GPU, its node and the job on it.

Pure functions over one telemetry sample, so the table of rules is testable without a database.
XID meanings follow NVIDIA's XID catalog: 48 double-bit ECC, 74 NVLink error, 79 fallen off the
bus, 95 uncontained ECC, 119/120 GSP errors; 13, 31 and 43 are faults of the application.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

GPU_FATAL_XIDS = frozenset({48, 74, 79, 95, 119, 120})
JOB_FAULT_XIDS = frozenset({13, 31, 43})
THERMAL_THROTTLE = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown"})
SHUTDOWN_MARGIN_C = 5.0  # within this of the shutdown temperature counts as at it
DEFAULT_SHUTDOWN_C = 90.0


class Verdict(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class Assessment:
    gpu: Verdict
    reasons: tuple[str, ...] = ()
    job_fault_xids: tuple[int, ...] = ()  # fail the job on this GPU, keep the GPU


def assess(sample: dict[str, Any], *, shutdown_temp_c: float | None = None) -> Assessment:
    """The health of one GPU from one telemetry sample."""
    reasons: list[str] = []
    xids = [int(x) for x in sample.get("xid_events") or []]
    fatal = sorted(set(xids) & GPU_FATAL_XIDS)
    if sample.get("lost"):
        reasons.append("GPU lost (not visible to the driver)")
    if fatal:
        reasons.append(f"XID {', '.join(map(str, fatal))}")
    if (sample.get("ecc_uncorrected") or 0) > 0:
        reasons.append(f"{sample['ecc_uncorrected']} uncorrected ECC errors")
    if sample.get("row_remap_pending"):
        reasons.append("row remapping pending (needs a GPU reset)")
    temperature = sample.get("temperature_c")
    limit = shutdown_temp_c or DEFAULT_SHUTDOWN_C
    if temperature is not None and temperature >= limit - SHUTDOWN_MARGIN_C:
        reasons.append(f"temperature {temperature:.0f} °C at shutdown threshold {limit:.0f} °C")
    job_faults = tuple(sorted(set(xids) & JOB_FAULT_XIDS))
    if reasons:
        return Assessment(Verdict.UNHEALTHY, tuple(reasons), job_faults)
    throttles = sorted(set(sample.get("throttle_reasons") or []) & THERMAL_THROTTLE)
    if throttles:
        return Assessment(
            Verdict.DEGRADED, (f"thermal slowdown ({', '.join(throttles)})",), job_faults
        )
    return Assessment(Verdict.HEALTHY, (), job_faults)
