"""GPU backends behind one interface: NVML on a real host, a simulated host everywhere else.

Both give `inventory() -> dict` (what `/register` needs) and `sample(busy_uuids) -> list[dict]`
(one telemetry record per GPU, the `/heartbeat` shape plus a few extra keys). This module is the
only place in the project that imports `pynvml` (from the nvidia-ml-py package).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

try:
    import pynvml
except ImportError:  # a CPU-only demo host without nvidia-ml-py still runs, simulated
    pynvml = None

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# The keys of one telemetry record in the `/heartbeat` contract; samples carry a few more
# (index, temperature_shutdown_c) that the agent strips before sending.
TELEMETRY_KEYS = (
    "uuid",
    "utilization",
    "memory_used_mib",
    "temperature_c",
    "power_w",
    "ecc_uncorrected",
    "row_remap_pending",
    "xid_events",
    "throttle_reasons",
    "processes",
    "lost",
)

# nvmlClocksEventReason* bits (same values as the deprecated ClocksThrottleReason* ones). Only the
# reasons that mean "the GPU is being slowed down" are reported; idle, application clocks, sync
# boost and display clocks are normal operation.
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x04, "sw_power_cap"),
    (0x08, "hw_slowdown"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake"),
)

# NVML return codes used below (stable ABI; looked up on the module when it has them).
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_TIMEOUT = 10
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_ERROR_GPU_IS_LOST = 15
_XID_CRITICAL_ERROR = 0x8
_XID_FELL_OFF_THE_BUS = 79


class GpuBackend(Protocol):
    """What the agent needs from a GPU backend."""

    simulated: bool

    def inventory(self) -> dict[str, Any]: ...

    def sample(
        self,
        busy_uuids: set[str],
        processes: Mapping[str, Sequence[int]] | None = None,
    ) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this host (no library, no driver, no package)."""


def lost_sample(uuid_: str, index: int, xid_events: Sequence[int] = ()) -> dict[str, Any]:
    """The telemetry record of a GPU that no longer answers."""
    return {
        "uuid": uuid_,
        "index": index,
        "utilization": None,
        "memory_used_mib": None,
        "temperature_c": None,
        "power_w": None,
        "ecc_uncorrected": None,
        "row_remap_pending": None,
        "xid_events": list(xid_events),
        "throttle_reasons": [],
        "processes": [],
        "lost": True,
        "temperature_shutdown_c": None,
    }


# ---------------------------------------------------------------------------------------------
# Simulated host
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimModel:
    """A GPU model the simulated host can have; `name` is the portal's catalog name."""

    name: str
    memory_mib: int
    tdp_w: float
    shutdown_c: int
    row_remapping: bool  # Ampere and later remap rows; Volta and Turing retire pages instead


SIM_MODELS: dict[str, SimModel] = {
    m.name: m
    for m in (
        SimModel("H200-141GB", 144384, 700, 92, True),
        SimModel("H100-80GB-SXM", 81559, 700, 92, True),
        SimModel("A100-80GB", 81920, 400, 92, True),
        SimModel("A100-40GB", 40960, 400, 92, True),
        SimModel("L40S", 46068, 350, 92, True),
        SimModel("L4", 23034, 72, 95, True),
        SimModel("A10", 23028, 150, 98, True),
        SimModel("T4", 15360, 70, 96, False),
        SimModel("V100-32GB", 32768, 300, 90, False),
    )
}

DEFAULT_SIM_GPUS = "4xH100-80GB-SXM"
SIM_DRIVER_VERSION = "550.54.15"
SIM_CUDA_VERSION = "12.4"

_SIM_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated-gpu.agent.gpu-cloud-portal")
_SPEC = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")

IDLE_TEMPERATURE_C = 32.0
DEGREES_PER_UTIL_PCT = 0.48  # 70 % → ~66 °C, 98 % → ~79 °C above nothing but the idle base
THERMAL_TIME_CONSTANT_S = 15.0
MEMORY_RAMP_TIME_CONSTANT_S = 10.0


def parse_sim_gpus(spec: str) -> list[str]:
    """`"4xH100-80GB-SXM"` or `"2xL4,2xT4"` → one catalog name per GPU, in index order."""
    names: list[str] = []
    for part in spec.split(","):
        if not part.strip():
            continue
        match = _SPEC.match(part)
        if match is None:
            raise ValueError(f"cannot read simulated GPU spec {part!r} (want e.g. 4xH100-80GB-SXM)")
        count = int(match.group(1) or 1)
        name = match.group(2)
        if name not in SIM_MODELS:
            known = ", ".join(SIM_MODELS)
            raise ValueError(f"unknown simulated GPU model {name!r}; known models: {known}")
        names.extend([name] * count)
    if not names:
        raise ValueError("the simulated GPU spec names no GPU")
    return names


def sim_uuid(hostname: str, index: int) -> str:
    """A stable, UUID-shaped GPU id for a simulated GPU: the same host and index, the same id."""
    return f"GPU-{uuid.uuid5(_SIM_UUID_NAMESPACE, f'{hostname}/{index}')}"


@dataclass
class _SimGpu:
    index: int
    uuid: str
    model: SimModel
    temperature_c: float
    busy_since: float | None = None
    job_memory_fraction: float = 0.0
    last_sample_at: float | None = None
    ecc_uncorrected: int = 0
    row_remap_pending: bool = False
    lost: bool = False
    pending_xids: list[int] = field(default_factory=list)
    throttle_reasons: list[str] = field(default_factory=list)


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


class SimulatedBackend:
    """A believable GPU host with no GPUs: synthetic telemetry that follows the work it runs.

    Deterministic for a given seed and clock. Busy GPUs run at ~70–98 % utilization, their memory
    grows towards a per-job working set, temperature follows utilization with a thermal lag
    (idle ~32 °C, busy ~65–80 °C) and power moves between ~10 % of TDP and TDP. Faults can be
    injected (`inject_xid`, `inject_ecc_error`, `set_lost`, `set_throttle`).
    """

    simulated = True

    def __init__(
        self,
        gpus: str | Sequence[str] = DEFAULT_SIM_GPUS,
        *,
        hostname: str | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        names = parse_sim_gpus(gpus) if isinstance(gpus, str) else list(gpus)
        unknown = [n for n in names if n not in SIM_MODELS]
        if unknown:
            raise ValueError(f"unknown simulated GPU model(s): {', '.join(unknown)}")
        self.hostname = hostname or socket.gethostname()
        self._rng = random.Random(seed)
        self._clock = clock
        self._lock = threading.Lock()  # faults may be injected from another thread
        self._gpus = [
            _SimGpu(
                index=i,
                uuid=sim_uuid(self.hostname, i),
                model=SIM_MODELS[name],
                temperature_c=IDLE_TEMPERATURE_C + self._rng.uniform(-1.5, 1.5),
            )
            for i, name in enumerate(names)
        ]

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self._gpus]

    def inventory(self) -> dict[str, Any]:
        return {
            "simulated": True,
            "driver_version": SIM_DRIVER_VERSION,
            "cuda_version": SIM_CUDA_VERSION,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.model.name,
                    "memory_mib": g.model.memory_mib,
                    "mig_mode": False,
                }
                for g in self._gpus
            ],
        }

    def sample(
        self,
        busy_uuids: set[str],
        processes: Mapping[str, Sequence[int]] | None = None,
    ) -> list[dict[str, Any]]:
        now = self._clock()
        with self._lock:
            return [self._sample_one(g, now, busy_uuids, processes or {}) for g in self._gpus]

    def close(self) -> None:
        """Nothing to release."""

    # -- fault injection (tests, demos) --------------------------------------------------------

    def _gpu(self, gpu: int | str) -> _SimGpu:
        for g in self._gpus:
            if gpu in (g.index, g.uuid):
                return g
        raise KeyError(f"no simulated GPU {gpu!r}")

    def inject_xid(self, gpu: int | str, code: int) -> None:
        """Deliver an XID event with this code in the GPU's next sample."""
        with self._lock:
            self._gpu(gpu).pending_xids.append(int(code))

    def inject_ecc_error(
        self, gpu: int | str, count: int = 1, *, remap_pending: bool = True
    ) -> None:
        """Add uncorrected ECC errors (volatile counter); by default also a pending row remap."""
        with self._lock:
            g = self._gpu(gpu)
            g.ecc_uncorrected += count
            if remap_pending and g.model.row_remapping:
                g.row_remap_pending = True

    def set_lost(self, gpu: int | str, lost: bool = True) -> None:
        """The GPU falls off the bus (XID 79) or comes back."""
        with self._lock:
            g = self._gpu(gpu)
            if lost and not g.lost:
                g.pending_xids.append(_XID_FELL_OFF_THE_BUS)
            g.lost = lost

    def set_throttle(self, gpu: int | str, reasons: Sequence[str]) -> None:
        """Report these throttle reasons until changed (e.g. ["hw_thermal_slowdown"])."""
        with self._lock:
            self._gpu(gpu).throttle_reasons = list(reasons)

    # -- the model -----------------------------------------------------------------------------

    def _sample_one(
        self,
        g: _SimGpu,
        now: float,
        busy_uuids: set[str],
        processes: Mapping[str, Sequence[int]],
    ) -> dict[str, Any]:
        rng = self._rng
        dt = 0.0 if g.last_sample_at is None else max(0.0, now - g.last_sample_at)
        g.last_sample_at = now
        xids, g.pending_xids = g.pending_xids, []
        if g.lost:
            return lost_sample(g.uuid, g.index, xids)

        model = g.model
        if g.uuid in busy_uuids:
            if g.busy_since is None:
                g.busy_since = now
                g.job_memory_fraction = rng.uniform(0.35, 0.9)
            utilization = round(_clamp(rng.gauss(88.0, 6.0), 70.0, 98.0))
            ramp = 1.0 - math.exp(-(now - g.busy_since) / MEMORY_RAMP_TIME_CONSTANT_S)
            floor = 512.0  # CUDA context
            target = model.memory_mib * g.job_memory_fraction
            memory_used = floor + (target - floor) * ramp + rng.uniform(-64.0, 64.0)
        else:
            g.busy_since = None
            utilization = rng.randint(0, 3)
            memory_used = rng.uniform(0.0, 4.0)
        memory_used = _clamp(memory_used, 0.0, float(model.memory_mib))

        target_c = IDLE_TEMPERATURE_C + DEGREES_PER_UTIL_PCT * utilization + rng.gauss(0.0, 0.4)
        g.temperature_c += (target_c - g.temperature_c) * (
            1.0 - math.exp(-dt / THERMAL_TIME_CONSTANT_S)
        )

        idle_w = 0.1 * model.tdp_w
        power = idle_w + (model.tdp_w - idle_w) * utilization / 100.0
        power += rng.gauss(0.0, 0.01 * model.tdp_w)
        power = _clamp(power, 0.08 * model.tdp_w, float(model.tdp_w))

        pids = list(processes.get(g.uuid, ()))
        per_process = int(memory_used) // len(pids) if pids else 0
        return {
            "uuid": g.uuid,
            "index": g.index,
            "utilization": utilization,
            "memory_used_mib": int(memory_used),
            "temperature_c": round(g.temperature_c),
            "power_w": round(power, 1),
            "ecc_uncorrected": g.ecc_uncorrected,
            "row_remap_pending": g.row_remap_pending if model.row_remapping else None,
            "xid_events": xids,
            "throttle_reasons": list(g.throttle_reasons),
            "processes": [{"pid": pid, "used_memory_mib": per_process} for pid in pids],
            "lost": False,
            "temperature_shutdown_c": model.shutdown_c,
        }


# ---------------------------------------------------------------------------------------------
# NVML
# ---------------------------------------------------------------------------------------------


class _GpuLost(Exception):
    pass


@dataclass
class _NvmlDevice:
    index: int
    handle: Any
    uuid: str
    lost: bool = False
    shutdown_c: int | None = None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> Any:
    """A hashable key for an NVML device handle (a ctypes pointer: its address)."""
    if isinstance(handle, int | str | bytes):
        return handle
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def cuda_version_text(version: int | None) -> str | None:
    """NVML's CUDA driver version integer (12040) as the usual text ("12.4")."""
    if not version:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


class NvmlBackend:
    """The real thing: inventory and telemetry from NVML.

    Every query a device does not support (or refuses) degrades to None; a GPU that stops
    answering with NVML_ERROR_GPU_IS_LOST is reported as `lost` from then on. `nvml` may be a
    stand-in for the pynvml module in tests.
    """

    simulated = False

    def __init__(self, nvml: Any = None) -> None:
        nv = nvml if nvml is not None else pynvml
        if nv is None:
            raise NvmlUnavailable("the nvidia-ml-py package (module pynvml) is not installed")
        self._nv = nv
        self._error_type: type[BaseException] = nv.NVMLError
        self._noted: set[tuple[int, str]] = set()
        self._closed = False
        try:
            nv.nvmlInit()
        except self._error_type as exc:
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        try:
            count = int(nv.nvmlDeviceGetCount())
        except self._error_type as exc:
            nv.nvmlShutdown()
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {exc}") from exc
        self._devices: list[_NvmlDevice] = []
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                device = _NvmlDevice(index, handle, _text(nv.nvmlDeviceGetUUID(handle)))
            except self._error_type as exc:
                log.error("GPU %d cannot be used and is left out of the inventory: %s", index, exc)
                continue
            threshold = getattr(nv, "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0)
            shutdown = self._call_safely(
                device, "nvmlDeviceGetTemperatureThreshold", device.handle, threshold
            )
            device.shutdown_c = int(shutdown) if shutdown is not None else None
            self._devices.append(device)
        self._by_handle = {_handle_key(d.handle): d for d in self._devices}
        self._event_set = self._register_xid_events()

    # -- plumbing ------------------------------------------------------------------------------

    def _code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _call(self, device: _NvmlDevice, fn_name: str, *args: Any) -> Any:
        """One NVML query: None where unsupported or refused; `_GpuLost` when the GPU is gone."""
        fn = getattr(self._nv, fn_name, None)
        if fn is None:
            self._note(device, fn_name, "not in this nvidia-ml-py")
            return None
        try:
            return fn(*args)
        except self._error_type as exc:
            if self._code(exc) == getattr(
                self._nv, "NVML_ERROR_GPU_IS_LOST", _NVML_ERROR_GPU_IS_LOST
            ):
                device.lost = True
                raise _GpuLost from exc
            self._note(device, fn_name, str(exc))
            return None

    def _call_safely(self, device: _NvmlDevice, fn_name: str, *args: Any) -> Any:
        try:
            return self._call(device, fn_name, *args)
        except _GpuLost:
            return None

    def _note(self, device: _NvmlDevice, fn_name: str, why: str) -> None:
        if (device.index, fn_name) not in self._noted:
            self._noted.add((device.index, fn_name))
            log.info("GPU %d: %s unavailable (%s); reporting None", device.index, fn_name, why)

    def _system(self, fn_name: str) -> Any:
        fn = getattr(self._nv, fn_name, None)
        if fn is None:
            return None
        try:
            return fn()
        except self._error_type as exc:
            log.info("%s unavailable (%s)", fn_name, exc)
            return None

    # -- inventory -----------------------------------------------------------------------------

    def inventory(self) -> dict[str, Any]:
        driver = self._system("nvmlSystemGetDriverVersion")
        cuda = self._system("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = self._system("nvmlSystemGetCudaDriverVersion")
        mig_enabled = getattr(self._nv, "NVML_DEVICE_MIG_ENABLE", 1)
        gpus = []
        for d in self._devices:
            name = self._call_safely(d, "nvmlDeviceGetName", d.handle)
            memory = self._call_safely(d, "nvmlDeviceGetMemoryInfo", d.handle)
            mig = self._call_safely(d, "nvmlDeviceGetMigMode", d.handle)
            gpus.append(
                {
                    "index": d.index,
                    "uuid": d.uuid,
                    "name": _text(name) if name is not None else "unknown",
                    "memory_mib": int(memory.total) // MIB if memory is not None else 0,
                    "mig_mode": bool(mig is not None and mig[0] == mig_enabled),
                }
            )
        return {
            "simulated": False,
            "driver_version": _text(driver) if driver is not None else None,
            "cuda_version": cuda_version_text(cuda),
            "gpus": gpus,
        }

    # -- telemetry -----------------------------------------------------------------------------

    def sample(
        self,
        busy_uuids: set[str],
        processes: Mapping[str, Sequence[int]] | None = None,
    ) -> list[dict[str, Any]]:
        """One record per GPU; `busy_uuids` and `processes` are ignored (NVML knows better)."""
        xids = self._drain_xid_events()
        out = []
        for d in self._devices:
            events = xids.get(d.uuid, [])
            if d.lost:
                out.append(lost_sample(d.uuid, d.index, events))
                continue
            try:
                out.append(self._sample_device(d, events))
            except _GpuLost:
                log.error("GPU %d (%s) is lost", d.index, d.uuid)
                out.append(lost_sample(d.uuid, d.index, events))
        return out

    def _sample_device(self, d: _NvmlDevice, xid_events: list[int]) -> dict[str, Any]:
        nv, h = self._nv, d.handle
        rates = self._call(d, "nvmlDeviceGetUtilizationRates", h)
        memory = self._call(d, "nvmlDeviceGetMemoryInfo", h)
        temperature = self._call(
            d, "nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)
        )
        power_mw = self._call(d, "nvmlDeviceGetPowerUsage", h)
        ecc = self._call(
            d,
            "nvmlDeviceGetTotalEccErrors",
            h,
            getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(nv, "NVML_VOLATILE_ECC", 0),
        )
        remap = self._call(d, "nvmlDeviceGetRemappedRows", h)
        procs = self._call(d, "nvmlDeviceGetComputeRunningProcesses", h)
        return {
            "uuid": d.uuid,
            "index": d.index,
            "utilization": int(rates.gpu) if rates is not None else None,
            "memory_used_mib": int(memory.used) // MIB if memory is not None else None,
            "temperature_c": int(temperature) if temperature is not None else None,
            "power_w": round(power_mw / 1000.0, 1) if power_mw is not None else None,
            "ecc_uncorrected": int(ecc) if ecc is not None else None,
            # (corrected rows, uncorrected rows, pending, failure)
            "row_remap_pending": bool(remap[2]) if remap is not None else None,
            "xid_events": xid_events,
            "throttle_reasons": self._throttle_reasons(d),
            "processes": [
                {
                    "pid": int(p.pid),
                    "used_memory_mib": (
                        int(p.usedGpuMemory) // MIB if p.usedGpuMemory is not None else None
                    ),
                }
                for p in (procs or [])
            ],
            "lost": False,
            "temperature_shutdown_c": d.shutdown_c,
        }

    def _throttle_reasons(self, d: _NvmlDevice) -> list[str]:
        mask = None
        if hasattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons"):
            mask = self._call(d, "nvmlDeviceGetCurrentClocksEventReasons", d.handle)
        if mask is None:  # drivers before 535 only have the older name
            mask = self._call(d, "nvmlDeviceGetCurrentClocksThrottleReasons", d.handle)
        if mask is None:
            return []
        return [name for bit, name in THROTTLE_REASON_BITS if int(mask) & bit]

    # -- XID events ----------------------------------------------------------------------------

    def _register_xid_events(self) -> Any:
        nv = self._nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except self._error_type as exc:
            log.info("NVML events unavailable (%s); no XID reporting", exc)
            return None
        event_type = getattr(nv, "nvmlEventTypeXidCriticalError", _XID_CRITICAL_ERROR)
        registered = 0
        for d in self._devices:
            try:
                nv.nvmlDeviceRegisterEvents(d.handle, event_type, event_set)
                registered += 1
            except self._error_type as exc:
                log.info("GPU %d: XID events unavailable (%s)", d.index, exc)
        if registered == 0:
            self._free_event_set(event_set)
            return None
        return event_set

    def _drain_xid_events(self) -> dict[str, list[int]]:
        """Every XID event since the last sample, by GPU UUID (a non-blocking poll)."""
        if self._event_set is None:
            return {}
        nv = self._nv
        timeout_code = getattr(nv, "NVML_ERROR_TIMEOUT", _NVML_ERROR_TIMEOUT)
        event_type = getattr(nv, "nvmlEventTypeXidCriticalError", _XID_CRITICAL_ERROR)
        found: dict[str, list[int]] = {}
        for _ in range(256):  # bounded: a storm of events must not stall the heartbeat
            try:
                data = nv.nvmlEventSetWait_v2(self._event_set, 0)
            except self._error_type as exc:
                if self._code(exc) != timeout_code:
                    log.info("reading NVML events failed: %s", exc)
                break
            if not int(data.eventType) & event_type:
                continue
            device = self._by_handle.get(_handle_key(data.device))
            if device is not None:
                uuid_ = device.uuid
            else:
                try:
                    uuid_ = _text(nv.nvmlDeviceGetUUID(data.device))
                except self._error_type:
                    continue
            found.setdefault(uuid_, []).append(int(data.eventData))
        return found

    def _free_event_set(self, event_set: Any) -> None:
        with contextlib.suppress(self._error_type):
            self._nv.nvmlEventSetFree(event_set)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._event_set is not None:
            self._free_event_set(self._event_set)
            self._event_set = None
        try:
            self._nv.nvmlShutdown()
        except self._error_type as exc:
            log.info("nvmlShutdown failed: %s", exc)


def select_backend(
    *,
    simulate: bool = False,
    sim_gpus: str = DEFAULT_SIM_GPUS,
    hostname: str | None = None,
    seed: int | None = None,
    nvml: Any = None,
) -> GpuBackend:
    """NVML where it works; otherwise (or when asked) a simulated host with `sim_gpus`."""
    if simulate:
        log.info("simulated mode requested: %s", sim_gpus)
        return SimulatedBackend(sim_gpus, hostname=hostname, seed=seed)
    try:
        return NvmlBackend(nvml)
    except NvmlUnavailable as exc:
        log.warning("NVML is not available (%s): running as a SIMULATED host (%s)", exc, sim_gpus)
        return SimulatedBackend(sim_gpus, hostname=hostname, seed=seed)
