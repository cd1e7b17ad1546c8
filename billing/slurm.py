"""Slurm accounting → the billing ledger (billing's side of Slurm-backed pools: billing reads
the scheduler, never the other way round).

`sacct --json --duplicates` gives one record per run of a job (a requeued job has several).
Each run of a job the portal submitted becomes allocations of our job (one per GPU, attempt =
run number, Slurm's start and end), and billing's own `usage_meter` turns allocations into
usage records, so invoices, budgets and the FOCUS export read Slurm pools like any other.
Re-reading a day changes nothing: allocations are keyed (job, GPU, attempt) and usage records
(allocation, slice start), and a run's times come from Slurm, not from when it was read.

The job's allocated GRES × elapsed is what is billed; its steps run inside that allocation and
are reported (GPU-seconds per step) but not billed again. Records of jobs submitted to Slurm
directly (no portal job) are counted and left out: the ledger bills portal jobs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from billing.services import MeterResult, usage_meter
from foundation.db import AnyOf, bulk_update_rows, insert_rows
from scheduler.backends.slurm.client import cluster_for
from scheduler.backends.slurm.models import SlurmJob, SlurmPool
from scheduler.backends.slurm.nodes import hostlist, mirror_name
from scheduler.models import Allocation, Gpu, GpuModel, Job, Node, Pool


@dataclass(frozen=True)
class Run:
    """One run of a Slurm job, as accounting tells it."""

    key: str  # '1234' or '1234_5'
    attempt: int  # 1 for the first run, 2 after one requeue …
    account: str
    nodes: tuple[str, ...]
    gpus: dict[str, int]  # GRES type ('' untyped) → count
    start: datetime | None
    end: datetime | None  # None while running
    elapsed_s: int
    step_gpu_seconds: dict[str, int] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        typed = sum(c for k, c in self.gpus.items() if k)
        return typed or self.gpus.get("", 0)


def _when(value: Any) -> datetime | None:
    return datetime.fromtimestamp(value, tz=UTC) if isinstance(value, int) and value > 0 else None


def _gres(tres: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tres or []:
        if t.get("type") == "gres" and str(t.get("name") or "").startswith("gpu"):
            name = str(t["name"])
            out[name.split(":", 1)[1] if ":" in name else ""] = int(t.get("count") or 0)
    return out


def parse_sacct(data: dict[str, Any] | list[dict[str, Any]]) -> list[Run]:
    """sacct --json (its `jobs`) → runs, attempts numbered by start within each job."""
    records = data.get("jobs", []) if isinstance(data, dict) else data
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        arr = r.get("array") or {}
        key = (
            f"{arr['job_id']}_{arr['task_id']}"
            if arr.get("job_id") and arr.get("task_id") is not None
            else str(r["job_id"])
        )
        by_key[key].append(r)
    runs: list[Run] = []
    for key, rs in by_key.items():
        rs.sort(key=lambda r: ((r.get("time") or {}).get("start") or 0, r.get("job_id", 0)))
        for n, r in enumerate(rs, start=1):
            t = r.get("time") or {}
            gpus = _gres((r.get("tres") or {}).get("allocated") or [])
            steps: dict[str, int] = {}
            for st in r.get("steps") or []:
                sg = _gres((st.get("tres") or {}).get("allocated") or [])
                count = sum(c for k, c in sg.items() if k) or sg.get("", 0)
                name = str((st.get("step") or {}).get("name") or (st.get("step") or {}).get("id"))
                steps[name] = count * int((st.get("time") or {}).get("elapsed") or 0)
            state = str((r.get("state") or {}).get("current", ""))
            running = state in ("RUNNING", "COMPLETING", "SUSPENDED")
            runs.append(
                Run(
                    key=key,
                    attempt=n,
                    account=str(r.get("account") or ""),
                    nodes=tuple(hostlist(str(r.get("nodes") or ""))),
                    gpus=gpus,
                    start=_when(t.get("start")),
                    end=None if running else _when(t.get("end")),
                    elapsed_s=int(t.get("elapsed") or 0),
                    step_gpu_seconds=steps,
                )
            )
    return runs


@dataclass
class MeteringResult:
    runs: int = 0
    ours: int = 0
    not_ours: int = 0
    allocations_created: int = 0
    allocations_updated: int = 0
    meter: MeterResult = field(default_factory=lambda: MeterResult(0, 0, 0))


class _Open(NamedTuple):
    """An allocation already written for a run and not metered to its end: what re-reading
    the run compares (a metered one is final)."""

    pk: int
    job_id: int
    attempt: int
    started_at: datetime
    ended_at: datetime | None
    end_reason: str


def write_runs(pool: Pool, runs: list[Run], *, now: datetime | None = None) -> MeteringResult:
    """Runs → allocations of our jobs → usage records (billing.usage_meter). Idempotent.

    Set-based (`bench.slurm_metering`): a fixed number of statements for any number of runs,
    each id list one array parameter; allocations are written as plain rows."""
    now = now or timezone.now()
    result = MeteringResult(runs=len(runs))
    known = _Known.read(pool, runs)
    rows = _Rows()
    for run in runs:
        job_id = known.links.get(run.key)
        if job_id is None:
            result.not_ours += 1
            continue
        result.ours += 1
        if run.start is None or run.gpu_count == 0:
            continue  # never ran, or held no GPU: nothing to bill
        if (job_id, run.attempt) in known.held:
            rows.update.extend(
                _changed_allocations(run, known.open_runs.get((job_id, run.attempt), ()))
            )
            continue
        rows.create.extend(_new_allocations(pool, run, job_id, known))
    with transaction.atomic():
        result.allocations_created = insert_rows(
            Allocation, Allocation.WRITTEN_FIELDS, rows.create, ignore_conflicts=True
        )
        result.allocations_updated = bulk_update_rows(
            Allocation, ["started_at", "ended_at", "end_reason"], rows.update
        )
    ids = list(known.allocations.values_list("pk", flat=True))
    result.meter = usage_meter(now=now, allocation_ids=ids) if ids else MeterResult(0, 0, 0)
    return result


@dataclass
class _Rows:
    """The allocations to create and those to correct (pk, start, end, end reason)."""

    create: list[tuple[Any, ...]] = field(default_factory=list)
    update: list[tuple[int, datetime, datetime | None, str]] = field(default_factory=list)


@dataclass
class _Known:
    """What the runs are compared with: our jobs behind them, the pool's mirrored nodes and
    GPUs, and the allocations already written for those jobs."""

    links: dict[str, int]  # Slurm job id → our job
    by_type: dict[str, str]  # Slurm GPU type → GPU model name
    models: dict[str, int]  # GPU model name → pk
    nodes: dict[str, int]  # mirrored node name → pk
    gpus_of: dict[int, list[tuple[int, int]]]  # node → (gpu pk, model pk)
    jobs: dict[int, tuple[bool, int | None]]  # our job → (borrowed, its GPU model)
    allocations: QuerySet[Allocation]
    held: set[tuple[int, int]]  # (job, attempt) with allocations written
    open_runs: dict[tuple[int, int], list[_Open]]
    model_of: dict[int, int] = field(init=False)  # gpu pk → its model pk

    def __post_init__(self) -> None:
        self.model_of = {g: m for gs in self.gpus_of.values() for g, m in gs}

    @classmethod
    def read(cls, pool: Pool, runs: list[Run]) -> _Known:
        cfg: SlurmPool = pool.slurm
        links = dict(
            SlurmJob.objects.filter(pool=pool)
            .filter(AnyOf(F("slurm_job_id"), sorted({r.key for r in runs})))
            .values_list("slurm_job_id", "job_id")
        )
        job_ids = sorted(set(links.values()))
        models = dict(
            GpuModel.objects.filter(name__in=list(cfg.gpu_types)).values_list("name", "pk")
        )
        nodes = dict(
            Node.objects.filter(pool=pool, provider=Node.Provider.SLURM).values_list("name", "pk")
        )
        gpus_of: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for pk, node_id, model_id in (
            Gpu.objects.filter(node_id__in=nodes.values())
            .order_by("node_id", "index")
            .values_list("pk", "node_id", "model_id")
        ):
            gpus_of[node_id].append((pk, model_id))
        jobs: dict[int, tuple[bool, int | None]] = {
            pk: (borrowed, gpu_model_id)
            for pk, borrowed, gpu_model_id in Job.objects.filter(
                AnyOf(F("pk"), job_ids)
            ).values_list("pk", "borrowed", "gpu_model_id")
        }
        allocations = Allocation.objects.filter(AnyOf(F("job_id"), job_ids))
        held = set(allocations.values_list("job_id", "attempt").distinct())
        open_runs: dict[tuple[int, int], list[_Open]] = defaultdict(list)
        for row in allocations.filter(Q(meter__isnull=True) | Q(meter__done=False)).values_list(
            "pk", "job_id", "attempt", "started_at", "ended_at", "end_reason"
        ):
            a = _Open._make(row)
            open_runs[(a.job_id, a.attempt)].append(a)
        return cls(
            links=links,
            by_type={str(v): k for k, v in cfg.gpu_types.items()},
            models=models,
            nodes=nodes,
            gpus_of=gpus_of,
            jobs=jobs,
            allocations=allocations,
            held=held,
            open_runs=open_runs,
        )


def _changed_allocations(
    run: Run, written: Iterable[_Open]
) -> list[tuple[int, datetime, datetime | None, str]]:
    """A run the sync saw: its open allocations whose start or end Slurm now reports otherwise."""
    start = run.start
    if start is None:  # never ran: the caller left it out already
        return []
    return [
        (a.pk, start, run.end, a.end_reason or ("completed" if run.end else ""))
        for a in written
        if a.started_at != run.start or a.ended_at != run.end
    ]


def _new_allocations(pool: Pool, run: Run, job_id: int, known: _Known) -> list[tuple[Any, ...]]:
    """A run the sync never saw: whole-GPU allocations on the first GPUs of each of its nodes
    (sacct does not name GPU indexes; only the count and the model matter to the ledger)."""
    node_ids = [
        known.nodes[n] for n in (mirror_name(pool, x) for x in run.nodes) if n in known.nodes
    ]
    if not node_ids:
        return []
    borrowed, job_model = known.jobs[job_id]
    wanted: list[tuple[int, int]] = []
    for kind, count in sorted(run.gpus.items()):
        if not kind and len(run.gpus) > 1:
            continue  # the untyped total repeats the typed counts
        model_pk = known.models.get(known.by_type.get(kind, "")) if kind else job_model
        per_node = max(1, count // len(node_ids))
        for node_id in node_ids:
            free = [g for g in known.gpus_of[node_id] if model_pk is None or g[1] == model_pk]
            wanted.extend((node_id, g[0]) for g in free[:per_node])
    return [
        (
            job_id,
            gpu_pk,
            node_id,
            run.attempt,
            1000,  # share_milli: a whole GPU
            0,  # memory_mib: the whole GPU's
            1000,  # billed_milli: a whole GPU
            known.model_of[gpu_pk],
            borrowed,
            run.start,
            run.end,
            "completed" if run.end else "",
        )
        for node_id, gpu_pk in wanted
    ]


def meter_day(pool: Pool, day: date, *, now: datetime | None = None) -> MeteringResult:
    """Read one UTC day of the pool's accounting and write it to the ledger."""
    # A week back: every run of a job that ran that day is listed, so that the runs of a
    # requeued job keep their numbers (attempts) whichever day is read.
    start = datetime(day.year, day.month, day.day, tzinfo=UTC) - timedelta(days=7)
    end = start + timedelta(days=8)
    records = cluster_for(pool).sacct(
        start=start.strftime("%Y-%m-%dT%H:%M:%S"), end=end.strftime("%Y-%m-%dT%H:%M:%S")
    )
    return write_runs(pool, parse_sacct(records), now=now)


def meter_recent(*, now: datetime | None = None) -> dict[str, int]:
    """The periodic task: yesterday and today of every Slurm pool (re-reading is harmless)."""
    now = now or timezone.now()
    totals = {"pools": 0, "runs": 0, "records": 0}
    for cfg in SlurmPool.objects.select_related("pool").filter(pool__backend=Pool.Backend.SLURM):
        for day in (now.date() - timedelta(days=1), now.date()):
            r = meter_day(cfg.pool, day, now=now)
            totals["runs"] += r.runs
            totals["records"] += r.meter.records
        totals["pools"] += 1
    return totals
