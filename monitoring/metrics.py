"""Prometheus exposition: GPU metrics under the DCGM exporter's names and labels, plus portal
metrics (queue, allocations, capacity, fragmentation, scheduling cycle, alerts).

Served at `/metrics` (root URL, wired in config/urls.py) and `/monitoring/metrics`. Access needs
`Authorization: Bearer <METRICS_TOKEN>` (compared in constant time) or a client address in
`METRICS_ALLOWED_IPS` (addresses or CIDR networks; REMOTE_ADDR only, never a forwarded header).
"""

from __future__ import annotations

import hmac
import ipaddress
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from monitoring import fleet, live
from monitoring.models import Alert, FleetSnapshot
from scheduler.core.model import MILLI, gpu_demand_milli
from scheduler.models import Allocation, Gpu, Job, JobState, Node


def cycle_ended(*, seconds: float, at: float, placed: int) -> None:
    """Cycle listener (`scheduler.ports.CYCLE_LISTENERS`): keep the last cycle for /metrics."""
    cache.set(
        settings.MONITORING_CYCLE_CACHE_KEY,
        {"seconds": seconds, "at": at, "placed": placed},
        timeout=3600,
    )


DCGM_LABELS = [
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "hpc_job",
]
DCGM_FIELDS = (
    # name, sample key, help
    ("DCGM_FI_DEV_GPU_UTIL", "utilization", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "memory_used_mib", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "_fb_free", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "_xid", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected", "Uncorrectable (double-bit) ECC errors."),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "_remap", "Row remapping pending (1) or not (0)."),
)


class PortalCollector(Collector):
    """Reads the fleet from PostgreSQL and the latest samples from Redis at scrape time."""

    def __init__(self, *, now: datetime) -> None:
        self.now = now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._dcgm()
        yield from self._portal()

    def _dcgm(self) -> Iterator[GaugeMetricFamily]:
        gpus = list(
            Gpu.objects.exclude(node__state=Node.State.RETIRED)
            .order_by("node__name", "index")
            .values_list(
                "pk",
                "index",
                "uuid",
                "memory_mib",
                "model__name",
                "node__name",
                "node__driver_version",
            )
        )
        jobs: dict[int, list[str]] = defaultdict(list)
        for gpu_id, job_id in Allocation.objects.filter(ended_at__isnull=True).values_list(
            "gpu_id", "job_id"
        ):
            jobs[gpu_id].append(str(job_id))
        latest = live.latest(g[0] for g in gpus)
        xids = live.last_xids()
        families = {
            name: GaugeMetricFamily(name, help_text, labels=DCGM_LABELS)
            for name, _key, help_text in DCGM_FIELDS
        }
        for pk, index, uuid, memory_mib, model, host, driver in gpus:
            sample = latest.get(pk)
            if sample is None:
                continue  # silent GPU: no sample rather than a stale one
            labels = [str(index), uuid, f"nvidia{index}", model, host, driver, ",".join(jobs[pk])]
            used = sample.get("memory_used_mib")
            derived = {
                "_fb_free": None if used is None else max(0, memory_mib - used),
                "_xid": xids.get(pk, (0, 0.0))[0],
                "_remap": 1 if sample.get("row_remap_pending") else 0,
            }
            for name, key, _help in DCGM_FIELDS:
                value = derived[key] if key.startswith("_") else sample.get(key)
                if value is not None:
                    families[name].add_metric(labels, float(value))
        yield from families.values()

    def _portal(self) -> Iterator[GaugeMetricFamily]:
        """The portal's own figures, family by family."""
        yield from _queue_metrics(now=self.now)
        yield from _allocation_metric()
        yield from _capacity_metrics()
        yield from _fragmentation_metric()
        yield from _cycle_metrics()
        yield from _alert_metric()


def _queue_metrics(*, now: datetime) -> Iterator[GaugeMetricFamily]:
    """Queued jobs and GPUs, and their waits, by requested GPU model."""
    queue_jobs = GaugeMetricFamily(
        "gpucloud_queue_jobs", "Jobs queued, by requested GPU model.", labels=["gpu_model"]
    )
    queue_gpus = GaugeMetricFamily(
        "gpucloud_queue_gpus", "GPUs asked for by queued jobs.", labels=["gpu_model"]
    )
    wait_max = GaugeMetricFamily(
        "gpucloud_queue_wait_seconds_max",
        "Longest wait of a queued job.",
        labels=["gpu_model"],
    )
    wait_avg = GaugeMetricFamily(
        "gpucloud_queue_wait_seconds_avg", "Mean wait of queued jobs.", labels=["gpu_model"]
    )
    waits: dict[str, list[float]] = defaultdict(list)
    gpus_asked: dict[str, float] = defaultdict(float)
    for model, queued_at, created_at, gpus, nodes, per_node, milli in Job.objects.filter(
        state=JobState.QUEUED
    ).values_list(
        "gpu_model__name",
        "queued_at",
        "created_at",
        "gpus",
        "nodes",
        "gpus_per_node",
        "gpu_milli",
    ):
        name = model or "any"
        waits[name].append((now - (queued_at or created_at)).total_seconds())
        gpus_asked[name] += gpu_demand_milli(gpus, nodes, per_node, milli) / MILLI
    for name, values in sorted(waits.items()):
        queue_jobs.add_metric([name], len(values))
        queue_gpus.add_metric([name], gpus_asked[name])
        wait_max.add_metric([name], max(values))
        wait_avg.add_metric([name], sum(values) / len(values))
    yield from (queue_jobs, queue_gpus, wait_max, wait_avg)


def _allocation_metric() -> Iterator[GaugeMetricFamily]:
    """Active allocations by GPU model."""
    allocations = GaugeMetricFamily(
        "gpucloud_allocations_active", "Active GPU allocations.", labels=["gpu_model"]
    )
    for model, n in (
        Allocation.objects.filter(ended_at__isnull=True)
        .values_list("gpu_model__name")
        .annotate(n=Count("pk"))
        .order_by("gpu_model__name")
    ):
        allocations.add_metric([model], n)
    yield allocations


def _capacity_metrics() -> Iterator[GaugeMetricFamily]:
    """The fleet's GPUs: total, free, allocated share, largest gang that fits."""
    capacity = fleet.fleet_capacity(fleet.gpu_cells())
    total = GaugeMetricFamily("gpucloud_gpus_total", "GPUs in the fleet.", labels=["gpu_model"])
    free = GaugeMetricFamily(
        "gpucloud_gpus_free", "Whole GPUs free on schedulable nodes.", labels=["gpu_model"]
    )
    ratio = GaugeMetricFamily(
        "gpucloud_gpu_allocated_ratio",
        "Allocated share of schedulable GPU capacity (0-1).",
        labels=["gpu_model"],
    )
    gang = GaugeMetricFamily(
        "gpucloud_largest_gang_gpus",
        "GPUs of the largest gang job that fits now.",
        labels=["gpu_model"],
    )
    for m in capacity.values():
        total.add_metric([m.model], m.total_gpus)
        free.add_metric([m.model], m.free_gpus)
        ratio.add_metric([m.model], m.allocated_pct / 100)
        gang.add_metric([m.model], m.largest_gang)
    yield from (total, free, ratio, gang)


def _fragmentation_metric() -> Iterator[GaugeMetricFamily]:
    """The fleet's fragmentation, from its last snapshot."""
    frag = GaugeMetricFamily(
        "gpucloud_fragmentation_ratio",
        "Fragmented share of idle GPU capacity (0-1), from the last fleet snapshot.",
    )
    snap = FleetSnapshot.objects.filter(model_name="").order_by("-at").first()
    if snap is not None:
        frag.add_metric([], snap.frag_ratio / 100)
    yield frag


def _cycle_metrics() -> Iterator[GaugeMetricFamily]:
    """The last scheduling cycle's duration and age."""
    cycle = GaugeMetricFamily(
        "gpucloud_scheduling_cycle_seconds", "Duration of the last scheduling cycle."
    )
    cycle_age = GaugeMetricFamily(
        "gpucloud_scheduling_cycle_age_seconds", "Time since the last scheduling cycle ended."
    )
    last = cache.get(settings.MONITORING_CYCLE_CACHE_KEY)
    if isinstance(last, dict) and "seconds" in last:
        cycle.add_metric([], float(last["seconds"]))
        if "at" in last:
            cycle_age.add_metric([], max(0.0, time.time() - float(last["at"])))
    yield from (cycle, cycle_age)


def _alert_metric() -> Iterator[GaugeMetricFamily]:
    """Open alerts by rule."""
    alerts = GaugeMetricFamily("gpucloud_alerts_open", "Open alerts.", labels=["rule"])
    counts = dict(
        Alert.objects.filter(resolved_at__isnull=True)
        .values_list("rule")
        .annotate(n=Count("pk"))
        .order_by("rule")
    )
    for rule in Alert.Rule.values:
        alerts.add_metric([rule], counts.get(rule, 0))
    yield alerts


def metrics_allowed(request: HttpRequest) -> bool:
    token = str(getattr(settings, "METRICS_TOKEN", "") or "")
    header = request.headers.get("Authorization", "")
    if (
        token
        and header.startswith("Bearer ")
        and hmac.compare_digest(header[7:].strip().encode(), token.encode())
    ):
        return True
    try:
        addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    for allowed in getattr(settings, "METRICS_ALLOWED_IPS", []):
        try:
            if addr in ipaddress.ip_network(str(allowed).strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


def exposition(*, now: datetime | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PortalCollector(now=now or timezone.now()))
    return generate_latest(registry)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape endpoint (token or allow-listed address; else 403)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse("Method not allowed.\n", status=405, content_type="text/plain")
    if not metrics_allowed(request):
        return HttpResponse(
            "Forbidden: send 'Authorization: Bearer <METRICS_TOKEN>' or scrape from an "
            "allow-listed address.\n",
            status=403,
            content_type="text/plain",
        )
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
