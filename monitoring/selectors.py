"""Reads for charts, efficiency, alerts and notifications; callers pass what the user may see.

Chart payloads share one shape, consumed by static/js/gpu-charts.js:
`{"range", "charts": [{"key", "title", "unit", "x": [epoch s], "series": [label], "values":
[[value|null per x] per series]}]}`.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
from django.conf import settings
from django.core.cache import cache
from django.db.models import ExpressionWrapper, F, FloatField, Q, QuerySet, Sum

from foundation.params import whole_number
from monitoring import fleet, live
from monitoring.models import (
    Alert,
    ClusterRollup,
    FleetSnapshot,
    GpuRollup,
    Notification,
    Resolution,
)
from portal.errors import DomainError
from portal.models import Project, User
from scheduler import ports
from scheduler.core.model import MILLI
from scheduler.core.periods import floor_hour
from scheduler.models import Allocation, Job, Node

log = logging.getLogger(__name__)

OPEN_END = 4_102_444_800.0  # 2100-01-01: an interval still running
METRICS = (
    ("utilization", "Utilization", "%"),
    ("memory_used_mib", "Memory used", "MiB"),
    ("temperature_c", "Temperature", "°C"),
    ("power_w", "Power", "W"),
)


@dataclass(frozen=True)
class ChartRange:
    name: str
    seconds: int
    source: str  # "live", "1m" or "1h"
    step: int  # seconds per chart point

    def since(self, now: datetime) -> datetime:
        return now - timedelta(seconds=self.seconds)


RANGES = {
    "15m": ChartRange("15m", 900, "live", 2),
    "1h": ChartRange("1h", 3600, "live", 10),
    "24h": ChartRange("24h", 86_400, Resolution.MINUTE, 300),
    "7d": ChartRange("7d", 604_800, Resolution.HOUR, 3600),
}


def parse_range(raw: str | None) -> ChartRange:
    """`range` query parameter; a bad value is a DomainError naming it (a 400)."""
    value = (raw or "15m").strip()
    if value not in RANGES:
        raise DomainError(
            f"Unknown range '{value[:20]}'; use one of {', '.join(RANGES)}.", field="range"
        )
    return RANGES[value]


def parse_days(raw: str | None, *, default: int = 30, maximum: int = 90) -> int:
    value = whole_number((raw or str(default)).strip(), maximum=maximum)
    if value is None or value < 1:
        raise DomainError(f"days must be a whole number from 1 to {maximum}.", field="days")
    return value


def _align(
    per_series: list[dict[int, float | None]],
) -> tuple[list[int], list[list[float | None]]]:
    xs = sorted({x for s in per_series for x in s})
    return xs, [[s.get(x) for x in xs] for s in per_series]


def _chart(
    key: str, title: str, unit: str, labels: list[str], per_series: list[dict[int, float | None]]
) -> dict[str, Any]:
    xs, values = _align(per_series)
    rounded = [[None if v is None else round(v, 2) for v in vals] for vals in values]
    return {"key": key, "title": title, "unit": unit, "x": xs, "series": labels, "values": rounded}


Intervals = dict[int, list[tuple[float, float]]]  # gpu_id → [(start, end)] the job held it


GpuRef = tuple[int, int, str]  # gpu_id, node_id, label


def gpu_series(
    gpus: list[GpuRef],
    rng: ChartRange,
    *,
    now: datetime,
    job_id: int | None = None,
    intervals: Intervals | None = None,
) -> dict[str, Any]:
    """Utilization, memory, temperature and power of the given GPUs over the range.

    With `job_id`, only what the job held: live points inside its allocation intervals,
    rollup rows attributed to it.
    """
    ids = [g for g, _node, _label in gpus]
    since = rng.since(now).timestamp()
    step = rng.step
    data: dict[str, list[dict[int, float | None]]] = {m: [] for m, _t, _u in METRICS}
    if rng.source == "live":
        heartbeat = max(1.0, float(settings.NODE_HEARTBEAT_SECONDS))
        want = min(int(settings.MONITORING_LIVE_POINTS), math.ceil(rng.seconds / heartbeat) * 5)
        by_node: dict[int, list[int]] = defaultdict(list)
        for gpu_id, node_id, _label in gpus:
            by_node[node_id].append(gpu_id)
        windows = live.windows(dict(by_node), since_ts=since, max_points=want)
        for gpu_id in ids:
            spans = (intervals or {}).get(gpu_id, [])
            acc: dict[str, dict[int, float | None]] = {m: {} for m, _t, _u in METRICS}
            for p in windows.get(gpu_id, []):
                if job_id is not None and not any(a <= p.ts <= b for a, b in spans):
                    continue
                x = int(p.ts // step) * step
                acc["utilization"][x] = p.util
                acc["memory_used_mib"][x] = p.mem
                acc["temperature_c"][x] = p.temp
                acc["power_w"][x] = p.power
            for m in data:
                data[m].append(acc[m])
    else:
        qs = GpuRollup.objects.filter(
            resolution=rng.source, gpu_id__in=ids, bucket__gte=rng.since(now)
        )
        if job_id is not None:
            qs = qs.filter(held_by_job=job_id)
        sums: dict[tuple[int, int], list[float]] = {}
        for gpu_id, bucket, u, mem, t, pw, n in qs.values_list(
            "gpu_id", "bucket", "util_avg", "mem_avg", "temp_avg", "power_avg", "samples"
        ):
            x = int(bucket.timestamp() // step) * step
            s = sums.setdefault((gpu_id, x), [0.0, 0.0, 0.0, 0.0, 0.0])
            s[0] += u * n
            s[1] += mem * n
            s[2] += t * n
            s[3] += pw * n
            s[4] += n
        for gpu_id in ids:
            acc = {m: {} for m, _t, _u in METRICS}
            for (g, x), s in sums.items():
                if g != gpu_id or not s[4]:
                    continue
                for i, (m, _t, _u) in enumerate(METRICS):
                    acc[m][x] = s[i] / s[4]
            for m in data:
                data[m].append(acc[m])
    labels = [label for _g, _n, label in gpus]
    return {
        "range": rng.name,
        "charts": [_chart(m, title, unit, labels, data[m]) for m, title, unit in METRICS],
    }


def job_gpus(job: Job) -> tuple[list[GpuRef], Intervals]:
    """The GPUs a job holds or held (current attempt first) with its intervals on each."""
    allocs = Allocation.objects.filter(job=job).select_related("gpu", "node").order_by("-attempt")
    gpus: dict[int, GpuRef] = {}
    spans: Intervals = defaultdict(list)
    for a in allocs:
        gpus.setdefault(a.gpu_id, (a.gpu_id, a.node_id, f"{a.node.name}/gpu{a.gpu.index}"))
        end = a.ended_at.timestamp() if a.ended_at else OPEN_END
        spans[a.gpu_id].append((a.started_at.timestamp(), end))
    return list(gpus.values())[:64], dict(spans)


def job_series(job: Job, rng: ChartRange, *, now: datetime) -> dict[str, Any]:
    gpus, spans = job_gpus(job)
    return gpu_series(gpus, rng, now=now, job_id=job.pk, intervals=spans)


def node_series(node: Node, rng: ChartRange, *, now: datetime) -> dict[str, Any]:
    gpus = [(g.pk, node.pk, f"gpu{g.index}") for g in node.gpus.order_by("index")]
    return gpu_series(gpus, rng, now=now)


def cluster_series(rng: ChartRange, *, now: datetime) -> list[dict[str, Any]]:
    """Fleet utilization and held share per model, and the fragmentation ratio, over the range."""
    since = rng.since(now)
    util: dict[str, dict[int, float | None]] = defaultdict(dict)
    held: dict[str, dict[int, float | None]] = defaultdict(dict)
    if rng.source == "live":
        step = live.CLUSTER_STEP_S if rng.seconds <= 900 else 30
        merged: dict[tuple[str, int], list[float]] = {}
        buckets = live.cluster_buckets(start_ts=since.timestamp(), end_ts=now.timestamp())
        for b, counters in buckets.items():
            x = int(b // step) * step
            for name, value in counters.items():
                kind, model = name.split(":", 1)
                slot = merged.setdefault((model, x), [0.0, 0.0, 0.0])
                slot["nuh".index(kind)] += value
        for (model, x), (n, u, h) in merged.items():
            if n:
                util[model][x] = u / n
                held[model][x] = 100.0 * h / n
    else:
        step = rng.step
        sums: dict[tuple[str, int], list[float]] = {}
        rows = ClusterRollup.objects.filter(resolution=rng.source, bucket__gte=since).values_list(
            "model_name", "bucket", "samples", "held_samples", "util_avg"
        )
        for model, bucket, n, h, u in rows:
            x = int(bucket.timestamp() // step) * step
            s = sums.setdefault((model, x), [0.0, 0.0, 0.0])
            s[0] += n
            s[1] += h
            s[2] += u * n
        for (model, x), (n, h, uw) in sums.items():
            if n:
                util[model][x] = uw / n
                held[model][x] = 100.0 * h / n
    frag: dict[int, float | None] = {}
    frag_step = max(60, step)
    for at, ratio in FleetSnapshot.objects.filter(model_name="", at__gte=since).values_list(
        "at", "frag_ratio"
    ):
        frag[int(at.timestamp() // frag_step) * frag_step] = ratio
    models = sorted(set(util) | set(held))
    return [
        _chart("util", "Average GPU utilization", "%", models, [util[m] for m in models]),
        _chart("held", "GPUs held by jobs", "%", models, [held[m] for m in models]),
        _chart("frag", "Fragmentation ratio", "%", ["fleet"], [frag]),
    ]


HEALTHS = ("healthy", "degraded", "unhealthy")


def heatmap(cells: list[fleet.GpuCell], utils: dict[int, float]) -> dict[str, Any]:
    """Every GPU in node order as parallel arrays; node i owns the next `nodes[i][3]` cells.

    Columns rather than one object per GPU: at 20,000 GPUs this is a few hundred kB of
    numbers that encode and draw quickly.
    """
    nodes: list[list[Any]] = []
    models: dict[str, int] = {}
    healths = {h: i for i, h in enumerate(HEALTHS)}
    gpu, index, model, util, used, capacity, health = [], [], [], [], [], [], []
    last = None
    for c in cells:
        if c.node_id != last:
            nodes.append([c.node_id, c.node, c.node_state, 0])
            last = c.node_id
        nodes[-1][3] += 1
        gpu.append(c.gpu_id)
        index.append(c.index)
        model.append(models.setdefault(c.model, len(models)))
        util.append(utils.get(c.gpu_id))
        used.append(c.used_milli)
        capacity.append(c.capacity_milli)
        health.append(healths.get(c.health, 0))
    return {
        "nodes": nodes,
        "models": list(models),
        "healths": list(HEALTHS),
        "gpu": gpu,
        "index": index,
        "model": model,
        "util": util,
        "used_milli": used,
        "capacity_milli": capacity,
        "health": health,
    }


def cluster_overview(rng: ChartRange, *, now: datetime) -> dict[str, Any]:
    """Everything the operators' overview polls: heatmap, capacity, queue, charts."""
    cells = fleet.gpu_cells(structure_max_age_s=float(settings.MONITORING_FLEET_CACHE_S))
    utils = live.latest_utilization(c.gpu_id for c in cells)
    capacity = fleet.fleet_capacity(cells)
    queue = fleet.queue_by_model()
    latest_frag = FleetSnapshot.objects.filter(model_name="").order_by("-at").first()
    models = []
    for name in sorted(set(capacity) | {m for m in queue if m != "any"}):
        m = capacity.get(name, fleet.ModelCapacity(name))
        q = queue.get(name, {"jobs": 0, "gpus": 0.0})
        models.append(
            {
                "model": name,
                "total": m.total_gpus,
                "free": m.free_gpus,
                "allocated_pct": round(m.allocated_pct, 1),
                "largest_gang": m.largest_gang,
                "gang_shape": list(m.gang_shape),
                "largest_node_block": m.largest_node_block,
                "queued_jobs": int(q["jobs"]),
                "queued_gpus": round(q["gpus"], 2),
            }
        )
    return {
        "range": rng.name,
        "generated_at": now.timestamp(),
        "heatmap": heatmap(cells, utils),
        "models": models,
        "queue_any": queue.get("any", {"jobs": 0, "gpus": 0.0}),
        "fragmentation": None
        if latest_frag is None
        else {"ratio": round(latest_frag.frag_ratio, 1), "at": latest_frag.at.isoformat()},
        "charts": cluster_series(rng, now=now),
    }


def cluster_overview_json(rng: ChartRange, *, now: datetime) -> bytes:
    """The overview as JSON, shared by every operator for MONITORING_OVERVIEW_CACHE_S.

    Operators all see the same fleet, and each open overview polls every 2 s: one computation
    serves them all, and nothing is older than the cache time.
    """
    ttl = float(settings.MONITORING_OVERVIEW_CACHE_S)
    cache_key = live.key("overview", rng.name)
    if ttl > 0:
        hit = cache.get(cache_key)
        if hit is not None:
            return bytes(hit)
    body = orjson.dumps(cluster_overview(rng, now=now))
    if ttl > 0:
        cache.set(cache_key, body, timeout=ttl)
    return body


# ------------------------------------------------------------------ efficiency
@dataclass
class Efficiency:
    gpu_hours: float = 0.0
    weighted_samples: float = 0.0
    weighted_util: float = 0.0
    weighted_idle: float = 0.0
    cost: Decimal = Decimal("0")
    idle_cost: Decimal = Decimal("0")

    @property
    def avg_util(self) -> float | None:
        return self.weighted_util / self.weighted_samples if self.weighted_samples else None

    @property
    def idle_fraction(self) -> float | None:
        return self.weighted_idle / self.weighted_samples if self.weighted_samples else None

    @property
    def idle_gpu_hours(self) -> float:
        return self.gpu_hours * (self.idle_fraction or 0.0)

    def add(self, other: Efficiency) -> None:
        self.gpu_hours += other.gpu_hours
        self.weighted_samples += other.weighted_samples
        self.weighted_util += other.weighted_util
        self.weighted_idle += other.weighted_idle
        self.cost += other.cost
        self.idle_cost += other.idle_cost

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_hours": round(self.gpu_hours, 4),
            "avg_utilization": None if self.avg_util is None else round(self.avg_util, 2),
            "idle_gpu_hours": round(self.idle_gpu_hours, 4),
            "idle_fraction": None if self.idle_fraction is None else round(self.idle_fraction, 4),
            "cost": str(self.cost.quantize(Decimal("0.01"))),
            "idle_cost": str(self.idle_cost.quantize(Decimal("0.01"))),
        }


def efficiency_for_jobs(
    job_ids: Iterable[int], *, since: datetime | None, now: datetime
) -> dict[int, Efficiency]:
    """Per job: allocated GPU-hours, share-weighted utilization and idle fraction, cost at
    the job's rate. Three queries whatever the number of jobs."""
    ids = list(job_ids)
    out: dict[int, Efficiency] = {i: Efficiency() for i in ids}
    if not ids:
        return out
    allocs = Allocation.objects.filter(job_id__in=ids).select_related("gpu_model", "job", "gpu")
    if since is not None:
        allocs = allocs.exclude(ended_at__lt=since)
    for a in allocs:
        start = max(a.started_at, since) if since else a.started_at
        end = a.ended_at or now
        held = a.billed_share()  # as billing bills it
        hours = max(0.0, (end - start).total_seconds()) / 3600 * held / MILLI
        out[a.job_id].gpu_hours += hours
    # the cost is billing's one figure for the job (the job page and the usage page show it)
    for job_id, cost in ports.JOBS_COST.get()(ids, since=since, now=now).items():
        out[job_id].cost = cost
    cutoff = floor_hour(now) - timedelta(hours=1)
    fl = FloatField()
    qs = GpuRollup.objects.filter(held_by_job__in=ids).filter(
        Q(resolution=Resolution.MINUTE, bucket__gte=cutoff)
        | Q(resolution=Resolution.HOUR, bucket__lt=cutoff)
    )
    if since is not None:
        qs = qs.filter(bucket__gte=floor_hour(since))
    rows = qs.values("held_by_job").annotate(
        w=Sum(ExpressionWrapper(F("samples") * F("share_milli"), output_field=fl)),
        wu=Sum(ExpressionWrapper(F("util_avg") * F("samples") * F("share_milli"), output_field=fl)),
        wi=Sum(ExpressionWrapper(F("idle_samples") * F("share_milli"), output_field=fl)),
    )
    for row in rows:
        e = out[row["held_by_job"]]
        e.weighted_samples, e.weighted_util, e.weighted_idle = row["w"], row["wu"], row["wi"]
    for e in out.values():
        if e.gpu_hours and e.idle_fraction:
            e.idle_cost = e.cost * Decimal(str(round(e.idle_fraction, 6)))
    return out


def job_efficiency(job: Job, *, now: datetime) -> tuple[Efficiency, Decimal | None]:
    """The job's efficiency, and what billing says it cost (None when billing fails: logged)."""
    eff = efficiency_for_jobs([job.pk], since=None, now=now)[job.pk]
    billed = None
    try:
        billed = ports.JOB_COST.get()(job, now=now)
    except Exception:  # billing is another app: its failure must not break this page
        log.exception("job cost of job %s failed", job.pk)
    return eff, billed


def project_efficiency(
    project: Project, *, days: int, now: datetime, limit: int = 200
) -> tuple[list[tuple[Job, Efficiency]], Efficiency]:
    """Jobs of the project that held GPUs in the last `days` days, with their efficiency."""
    since = now - timedelta(days=days)
    jobs = list(
        Job.objects.filter(project=project)
        .filter(Q(allocations__ended_at__isnull=True) | Q(allocations__ended_at__gte=since))
        .distinct()
        .select_related("submitted_by", "gpu_model")
        .order_by("-created_at")[:limit]
    )
    per_job = efficiency_for_jobs([j.pk for j in jobs], since=since, now=now)
    total = Efficiency()
    for e in per_job.values():
        total.add(e)
    return [(j, per_job[j.pk]) for j in jobs], total


# ------------------------------------------------------------------ alerts and notifications
def alert_list(*, open_only: bool = True, rule: str | None = None) -> QuerySet[Alert]:
    qs = Alert.objects.select_related("node", "gpu", "job", "project")
    if open_only:
        qs = qs.filter(resolved_at__isnull=True)
    if rule:
        if rule not in Alert.Rule.values:
            raise DomainError(
                f"Unknown rule '{rule[:40]}'; use one of {', '.join(Alert.Rule.values)}.",
                field="rule",
            )
        qs = qs.filter(rule=rule)
    return qs.order_by("-opened_at", "-pk")


def notification_list_of(*, user: User) -> QuerySet[Notification]:
    return Notification.objects.filter(user=user).order_by("-created_at", "-pk")
