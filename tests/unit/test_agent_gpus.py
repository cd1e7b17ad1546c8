"""GPU backends: the simulated host's inventory and telemetry, and NVML's clean degradation."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.gpus import (
    SIM_MODELS,
    TELEMETRY_KEYS,
    NvmlBackend,
    NvmlUnavailable,
    SimulatedBackend,
    cuda_version_text,
    parse_sim_gpus,
    select_backend,
    sim_uuid,
)


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run_samples(
    backend: SimulatedBackend, clock: FakeClock, busy: set[str], n: int, dt: float
) -> list[list[dict[str, Any]]]:
    out = []
    for _ in range(n):
        out.append(backend.sample(busy))
        clock.advance(dt)
    return out


# -- the simulated host ------------------------------------------------------------------------


def test_sim_spec_parsing() -> None:
    assert parse_sim_gpus("4xH100-80GB-SXM") == ["H100-80GB-SXM"] * 4
    assert parse_sim_gpus("2xL4, 2xT4") == ["L4", "L4", "T4", "T4"]
    assert parse_sim_gpus("A100-40GB") == ["A100-40GB"]
    with pytest.raises(ValueError, match="unknown simulated GPU model 'B200'"):
        parse_sim_gpus("8xB200")
    with pytest.raises(ValueError):
        parse_sim_gpus("")


def test_sim_inventory_uses_catalog_names_and_stable_uuids() -> None:
    backend = SimulatedBackend("2xL4,1xH200-141GB", hostname="gpu-host-7")
    inv = backend.inventory()
    assert inv["simulated"] is True
    assert inv["driver_version"] and inv["cuda_version"] == "12.4"
    assert [g["name"] for g in inv["gpus"]] == ["L4", "L4", "H200-141GB"]
    assert [g["index"] for g in inv["gpus"]] == [0, 1, 2]
    assert inv["gpus"][2]["memory_mib"] == 144384
    assert inv["gpus"][0]["memory_mib"] == SIM_MODELS["L4"].memory_mib
    assert all(g["mig_mode"] is False for g in inv["gpus"])
    uuids = [g["uuid"] for g in inv["gpus"]]
    assert len(set(uuids)) == 3 and all(u.startswith("GPU-") for u in uuids)
    # Same host and index → same UUID across restarts; another host → other UUIDs.
    again = SimulatedBackend("2xL4,1xH200-141GB", hostname="gpu-host-7").inventory()
    assert [g["uuid"] for g in again["gpus"]] == uuids
    assert sim_uuid("gpu-host-8", 0) != uuids[0]


def test_sim_busy_gpu_heats_up_with_lag_and_idle_gpu_stays_cool() -> None:
    clock = FakeClock()
    backend = SimulatedBackend("2xH100-80GB-SXM", hostname="h", seed=7, clock=clock)
    busy_uuid = backend.uuids[0]
    samples = run_samples(backend, clock, {busy_uuid}, n=40, dt=5.0)
    busy = [s[0] for s in samples]
    idle = [s[1] for s in samples]
    tdp = SIM_MODELS["H100-80GB-SXM"].tdp_w

    assert all(70 <= s["utilization"] <= 98 for s in busy)
    assert all(0 <= s["utilization"] <= 3 for s in idle)
    # Thermal lag: the first busy sample is still at idle temperature; later it is hot.
    assert busy[0]["temperature_c"] < 40
    assert all(60 <= s["temperature_c"] <= 82 for s in busy[20:])
    assert all(28 <= s["temperature_c"] <= 36 for s in idle)
    assert all(0.08 * tdp <= s["power_w"] <= tdp for s in busy + idle)
    assert min(s["power_w"] for s in busy) > max(s["power_w"] for s in idle)
    # Memory grows with the job and stays under the GPU's size; the idle GPU holds ~nothing.
    assert busy[0]["memory_used_mib"] < busy[10]["memory_used_mib"] <= 81559
    assert busy[-1]["memory_used_mib"] > 0.3 * 81559
    assert all(s["memory_used_mib"] < 8 for s in idle)
    for s in busy + idle:
        assert set(TELEMETRY_KEYS) <= set(s)
        assert s["lost"] is False and s["xid_events"] == [] and s["ecc_uncorrected"] == 0


def test_sim_cools_down_after_the_job() -> None:
    clock = FakeClock()
    backend = SimulatedBackend("1xA100-80GB", hostname="h", seed=1, clock=clock)
    (gpu,) = backend.uuids
    hot = run_samples(backend, clock, {gpu}, n=30, dt=5.0)[-1][0]
    cooling = run_samples(backend, clock, set(), n=30, dt=5.0)
    assert hot["temperature_c"] >= 60
    assert cooling[1][0]["temperature_c"] > 40  # it takes a while
    assert cooling[-1][0]["temperature_c"] <= 36
    assert cooling[-1][0]["utilization"] <= 3


def test_sim_is_deterministic_under_a_seed() -> None:
    def trace(seed: int) -> list[list[dict[str, Any]]]:
        clock = FakeClock()
        backend = SimulatedBackend("2xL40S", hostname="h", seed=seed, clock=clock)
        return run_samples(backend, clock, {backend.uuids[0]}, n=10, dt=2.0)

    assert trace(42) == trace(42)
    assert trace(42) != trace(43)


def test_sim_reports_processes_it_is_told_about() -> None:
    backend = SimulatedBackend("1xL4", hostname="h", seed=3, clock=FakeClock())
    (gpu,) = backend.uuids
    (sample,) = backend.sample({gpu}, {gpu: [111, 222]})
    assert [p["pid"] for p in sample["processes"]] == [111, 222]
    assert all(p["used_memory_mib"] >= 0 for p in sample["processes"])


def test_sim_fault_injection() -> None:
    clock = FakeClock()
    backend = SimulatedBackend("2xA100-80GB,1xT4", hostname="h", seed=5, clock=clock)
    a, b, t4 = backend.uuids
    backend.inject_xid(0, 48)
    backend.inject_ecc_error(a, 2)
    backend.inject_ecc_error(t4, 1)
    backend.set_throttle(b, ["hw_thermal_slowdown"])
    first = backend.sample(set())
    assert first[0]["xid_events"] == [48]
    assert first[0]["ecc_uncorrected"] == 2 and first[0]["row_remap_pending"] is True
    assert first[1]["throttle_reasons"] == ["hw_thermal_slowdown"]
    assert first[2]["ecc_uncorrected"] == 1 and first[2]["row_remap_pending"] is None  # Turing
    second = backend.sample(set())
    assert second[0]["xid_events"] == []  # an event is delivered once
    assert second[0]["ecc_uncorrected"] == 2  # a counter stays

    backend.set_lost(b)
    lost = backend.sample({b})[1]
    assert lost["lost"] is True and lost["xid_events"] == [79]
    assert lost["utilization"] is None and lost["temperature_c"] is None
    assert backend.sample(set())[1]["xid_events"] == []
    backend.set_lost(b, False)
    assert backend.sample(set())[1]["lost"] is False


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    steps=st.lists(
        st.tuples(st.floats(0, 120), st.lists(st.booleans(), min_size=3, max_size=3)),
        min_size=1,
        max_size=25,
    ),
)
def test_sim_telemetry_stays_physical(seed: int, steps: list[tuple[float, list[bool]]]) -> None:
    clock = FakeClock()
    backend = SimulatedBackend(
        "1xT4,1xH200-141GB,1xV100-32GB", hostname="h", seed=seed, clock=clock
    )
    models = [SIM_MODELS[n] for n in ("T4", "H200-141GB", "V100-32GB")]
    for dt, flags in steps:
        clock.advance(dt)
        busy = {u for u, f in zip(backend.uuids, flags, strict=True) if f}
        for sample, model in zip(backend.sample(busy), models, strict=True):
            assert 0 <= sample["utilization"] <= 100
            assert 25 <= sample["temperature_c"] <= 85
            assert 0 < sample["power_w"] <= model.tdp_w
            assert 0 <= sample["memory_used_mib"] <= model.memory_mib


# -- NVML ----------------------------------------------------------------------------------------


def nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(nvml_works(), reason="this host has a working NVML")
def test_without_nvml_the_agent_runs_simulated() -> None:
    with pytest.raises(NvmlUnavailable, match="nvmlInit failed"):
        NvmlBackend()
    backend = select_backend(sim_gpus="2xL4", hostname="nogpu")
    assert isinstance(backend, SimulatedBackend)
    assert backend.simulated is True
    assert [g["name"] for g in backend.inventory()["gpus"]] == ["L4", "L4"]


@pytest.mark.skipif(nvml_works(), reason="this host has a working NVML")
def test_nvml_probe_exits_2_without_nvml(capsys: pytest.CaptureFixture[str]) -> None:
    from agent import nvml_probe

    assert nvml_probe.main([]) == 2
    assert "NVML is not available on this host" in capsys.readouterr().err


def test_simulate_flag_wins_even_with_nvml() -> None:
    backend = select_backend(simulate=True, sim_gpus="1xT4", nvml=FakeNvml())
    assert isinstance(backend, SimulatedBackend)


def test_cuda_version_text() -> None:
    assert cuda_version_text(12040) == "12.4"
    assert cuda_version_text(11080) == "11.8"
    assert cuda_version_text(0) is None


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


class FakeNvml:
    """Two GPUs through pynvml's real error types and constants: a full-featured H200 (index 0)
    and a device that supports almost nothing (index 1), with switches to lose it."""

    NVMLError = pynvml.NVMLError

    def __init__(self) -> None:
        for name in dir(pynvml):
            if name.startswith(("NVML_", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.handles = ["h0", "h1"]
        self.lost: set[str] = set()
        self.events: list[SimpleNamespace] = []
        self.registered: list[str] = []
        self.shut_down = False

    def _check(self, h: str) -> None:
        if h in self.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _only_h0(self, h: str) -> None:
        self._check(h)
        if h != "h0":
            raise nvml_error(NOT_SUPPORTED)

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return self.handles[i]

    def nvmlDeviceGetUUID(self, h: str) -> str:
        return f"GPU-0000000{h[-1]}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"NVIDIA H200" if h == "h0" else b"Tesla T4"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        self._check(h)
        total = 143771 if h == "h0" else 15360
        return SimpleNamespace(total=total * 1024 * 1024, used=2048 * 1024 * 1024)

    def nvmlDeviceGetMigMode(self, h: str) -> list[int]:
        self._only_h0(h)
        return [1, 1]

    def nvmlDeviceGetTemperatureThreshold(self, h: str, which: int) -> int:
        self._only_h0(h)
        assert which == pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
        return 92

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        self._check(h)
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        self._check(h)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        self._check(h)
        return 612345  # mW

    def nvmlDeviceGetTotalEccErrors(self, h: str, kind: int, counter: int) -> int:
        self._only_h0(h)
        assert (kind, counter) == (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        return 3

    def nvmlDeviceGetRemappedRows(self, h: str) -> tuple[int, int, int, int]:
        self._only_h0(h)
        return (0, 1, 1, 0)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        self._check(h)
        if h != "h0":  # an older driver: only the deprecated name answers
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return pynvml.nvmlClocksEventReasonGpuIdle | pynvml.nvmlClocksEventReasonHwThermalSlowdown

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: str) -> int:
        self._check(h)
        return pynvml.nvmlClocksThrottleReasonSwPowerCap

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[SimpleNamespace]:
        self._check(h)
        if h != "h0":
            return []
        return [
            SimpleNamespace(pid=4242, usedGpuMemory=1024 * 1024 * 1024),
            SimpleNamespace(pid=4343, usedGpuMemory=None),
        ]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: str, types: int, event_set: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError
        self._only_h0(h)
        self.registered.append(h)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # never block the heartbeat
        if not self.events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass


def test_nvml_inventory_and_unsupported_queries_degrade_to_none() -> None:
    fake = FakeNvml()
    backend = NvmlBackend(fake)
    inv = backend.inventory()
    assert inv["simulated"] is False
    assert inv["driver_version"] == "550.90.07" and inv["cuda_version"] == "12.4"
    assert inv["gpus"] == [
        {
            "index": 0,
            "uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
            "name": "NVIDIA H200",
            "memory_mib": 143771,
            "mig_mode": True,
        },
        {
            "index": 1,
            "uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
            "name": "Tesla T4",
            "memory_mib": 15360,
            "mig_mode": False,  # NotSupported
        },
    ]
    assert fake.registered == ["h0"]  # XID events where supported; the other GPU is tolerated

    fake.events.append(
        SimpleNamespace(device="h0", eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=79)
    )
    h200, t4 = backend.sample(set())
    assert h200 == {
        "uuid": "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd",
        "index": 0,
        "utilization": 87,
        "memory_used_mib": 2048,
        "temperature_c": 71,
        "power_w": 612.3,
        "ecc_uncorrected": 3,
        "row_remap_pending": True,
        "xid_events": [79],
        "throttle_reasons": ["hw_thermal_slowdown"],  # gpu_idle is not a slowdown
        "processes": [
            {"pid": 4242, "used_memory_mib": 1024},
            {"pid": 4343, "used_memory_mib": None},
        ],
        "lost": False,
        "temperature_shutdown_c": 92,
    }
    assert t4["ecc_uncorrected"] is None
    assert t4["row_remap_pending"] is None
    assert t4["temperature_shutdown_c"] is None
    assert t4["throttle_reasons"] == ["sw_power_cap"]  # via the deprecated call
    assert t4["utilization"] == 87 and t4["lost"] is False
    assert backend.sample(set())[0]["xid_events"] == []  # drained

    fake.lost.add("h1")
    _, gone = backend.sample(set())
    assert gone["lost"] is True and gone["utilization"] is None
    assert backend.sample(set())[1]["lost"] is True  # stays lost
    backend.close()
    assert fake.shut_down


def test_nvml_init_failure_is_nvml_unavailable() -> None:
    fake = FakeNvml()

    def broken_init() -> None:
        raise nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    fake.nvmlInit = broken_init  # type: ignore[method-assign]
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        NvmlBackend(fake)
    backend = select_backend(nvml=fake, sim_gpus="1xL4")
    assert backend.simulated is True


def test_sample_counter_is_per_instance() -> None:
    # Two simulated hosts in one process do not share random state.
    a = SimulatedBackend("1xL4", hostname="a", seed=9, clock=FakeClock())
    b = SimulatedBackend("1xL4", hostname="b", seed=9, clock=FakeClock())
    for _ in itertools.repeat(None, 3):
        a.sample(set(a.uuids))
    first_b = b.sample(set(b.uuids))[0]
    fresh = SimulatedBackend("1xL4", hostname="b", seed=9, clock=FakeClock())
    assert fresh.sample(set(fresh.uuids))[0] == first_b
