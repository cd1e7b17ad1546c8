"""What a researcher sees before submitting: cost, estimated start, the quota it draws on, and
for each GPU model the free GPUs, queued demand and the wait now."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Protocol

from django.core.cache import cache
from django.utils import timezone

from foundation.enqueue import enqueue
from portal.models import Project
from scheduler import ports
from scheduler.admission import (
    JobSpec,
    Verdict,
    admission_verdict,
    job_from_spec,
    spec_validate,
)
from scheduler.core.model import MILLI, billed_share_milli, gpus_requested
from scheduler.core.plan import Placement, plan
from scheduler.core.reasons import PendingReason, format_when
from scheduler.cycle import build_state, from_ts, job_request, policy_config, ts
from scheduler.job_volumes import volumes_resolve
from scheduler.models import Gpu, GpuModel, Job, JobState, Pool, Quota
from scheduler.selectors import ModelAsk, gpu_model_list, gpu_models_job_may_use

DRY_RUN_ID = -1
CENT = Decimal("0.01")


@dataclass(frozen=True)
class DryRun:
    admitted: bool
    borrowed: bool
    admission_reason: str
    quota_notes: tuple[str, ...]
    would_start_now: bool
    estimated_start: datetime | None
    wait_reason: str
    wait_message: str
    rate_per_gpu_hour: Decimal | None
    cost_per_hour: Decimal | None
    cost_for_estimate: Decimal | None
    queue_position: int | None
    # where it would wait with no model named: the cost on the dearest model it may land on
    cost_per_hour_most: Decimal | None = None
    # who answered where and when: "portal" (our plan) or "slurm" (sbatch --test-only)
    answered_by: str = "portal"


def _hypothetical_job(spec: JobSpec, project: Project, now: datetime) -> Job:
    job = job_from_spec(spec, project=project)
    job.pk, job.state, job.queued_at = DRY_RUN_ID, JobState.QUEUED, now
    return job


class PricedRequest(ModelAsk, Protocol):
    """What a quote reads of a job request (besides the models it may land on): a `JobSpec`
    before submission, or the `Job` row itself while it waits (one job row is one shard).
    Read from the row itself, never from a spec rebuilt from it: a copy that drops a field
    (the fraction's GPU memory) quotes less than billing charges."""

    @property
    def gpus(self) -> int: ...
    @property
    def gpu_milli(self) -> int: ...
    @property
    def gpu_memory_mib(self) -> int: ...
    @property
    def nodes(self) -> int | None: ...
    @property
    def gpus_per_node(self) -> int | None: ...
    @property
    def preemptible(self) -> bool: ...
    @property
    def runtime_estimate_s(self) -> int | None: ...


def _candidate_models(request: PricedRequest) -> list[GpuModel]:
    """The models a job may land on (`gpu_models_job_may_use`), of those the fleet has
    healthy GPUs of when it has any (a named model is its own answer)."""
    may = gpu_models_job_may_use(request)
    if request.gpu_model is not None or len(may) < 2:
        return may
    in_fleet = {m.pk for m in gpu_model_list() if m.fleet_gpus}  # type: ignore[attr-defined]
    return [m for m in may if m.pk in in_fleet] or may


def billed_gpus(request: PricedRequest, model: GpuModel, *, shards: int = 1) -> Decimal:
    """GPUs billed for the request on `model` before it is placed: each device's share as
    billing bills it (`billed_share_milli`: the larger of compute and memory, at least the
    minimum), on a device that is not time-sliced (a time-sliced one can only bill less),
    for each of its `shards`. The dry run, the job page and billing's hard-cap admission
    all reckon with this."""
    billed = billed_share_milli(
        min(request.gpu_milli, MILLI), MILLI, request.gpu_memory_mib, model.memory_mib
    )
    devices = gpus_requested(request.gpus, request.nodes, request.gpus_per_node)
    return Decimal(devices * billed * shards) / MILLI


def rates_now(models: Iterable[GpuModel], *, preemptible: bool = False) -> dict[int, Decimal]:
    """What billing charges per GPU-hour on each model now, by model id (billing's
    `ports.PRICE_QUOTE`: the price list, not the catalog's list price). Every price a page
    or the API shows, and every quote, comes from here."""
    models = list(models)
    if not models:
        return {}
    return ports.PRICE_QUOTE.get()(gpu_models=models, preemptible=preemptible)


def with_rates(models: Iterable[GpuModel]) -> list[GpuModel]:
    """The models, each with `rate_per_gpu_hour`: what billing charges on it now (on demand);
    the catalog's pages and API show this."""
    models = list(models)
    rates = rates_now(models)
    for model in models:
        model.rate_per_gpu_hour = rates[model.pk]  # type: ignore[attr-defined]
    return models


def _per_hour(rate: Decimal, request: PricedRequest, model: GpuModel, shards: int) -> Decimal:
    return (rate * billed_gpus(request, model, shards=shards)).quantize(CENT, ROUND_HALF_UP)


def quote(
    request: PricedRequest,
    *,
    borrowed: bool = False,
    candidates: list[GpuModel] | None = None,
    shards: int = 1,
) -> tuple[Decimal | None, Decimal | None, Decimal | None]:
    """(rate per GPU-hour, cost per hour, cost for the runtime estimate). Without a model, the
    cheapest model it may land on sets the rate (see `quote_most` for the dearest)."""
    if candidates is None:
        candidates = _candidate_models(request)
    rates = rates_now(candidates, preemptible=request.preemptible or borrowed)
    model = min(candidates, key=lambda m: (rates[m.pk], m.name), default=None)
    if model is None:
        return None, None, None
    rate = rates[model.pk]
    per_hour = _per_hour(rate, request, model, shards)
    return rate, per_hour, _for_estimate(per_hour, request)


def quote_most(
    request: PricedRequest,
    *,
    borrowed: bool = False,
    candidates: list[GpuModel] | None = None,
    shards: int = 1,
) -> Decimal | None:
    """Cost per hour on the dearest model a job without one may land on; None where every
    candidate costs the same (or the job names its model)."""
    if candidates is None:
        candidates = _candidate_models(request)
    rates = rates_now(candidates, preemptible=request.preemptible or borrowed)
    if len(set(rates.values())) < 2:
        return None
    model = max(candidates, key=lambda m: (rates[m.pk], m.name))
    return _per_hour(rates[model.pk], request, model, shards)


def _for_estimate(per_hour: Decimal, request: PricedRequest) -> Decimal | None:
    if not request.runtime_estimate_s:
        return None
    return (per_hour * Decimal(request.runtime_estimate_s) / 3600).quantize(CENT, ROUND_HALF_UP)


def shares_cost_per_hour(shares: Iterable[tuple[GpuModel, int]], *, preemptible: bool) -> Decimal:
    """What these `(model, billed_milli)` shares cost per hour, to the cent, as billing meters
    them (billing's `ports.SHARES_COST`)."""
    cost = ports.SHARES_COST.get()(shares=list(shares), preemptible=preemptible)
    return cost.quantize(CENT, ROUND_HALF_UP)


@dataclass(frozen=True)
class HourlyCost:
    """What a job costs per hour: exact once placed, else from `low` to `high` (None: one
    price) by the model it lands on."""

    low: Decimal
    high: Decimal | None = None


def job_hourly_cost(job: Job) -> HourlyCost | None:
    """What the job costs per hour while it runs, at today's rates: from the GPUs it holds
    when placed, else from what it asks for (the row itself: one shard)."""
    preemptible = job.preemptible or job.borrowed
    held = [
        (a.gpu_model, a.billed_share())
        for a in job.allocations.filter(ended_at__isnull=True).select_related("gpu_model", "gpu")
    ]
    if held:
        return HourlyCost(shares_cost_per_hour(held, preemptible=preemptible))
    if job.is_terminal:
        return None
    candidates = _candidate_models(job)
    low = quote(job, borrowed=job.borrowed, candidates=candidates)[1]
    if low is None:
        return None
    return HourlyCost(low, quote_most(job, borrowed=job.borrowed, candidates=candidates))


def job_dry_run(*, project: Project, spec: JobSpec) -> DryRun:
    """Plan the cluster as it is now with this job added; nothing is written."""
    spec = spec_validate(spec)
    volumes_resolve(project=project, volumes=spec.volumes)
    now = timezone.now()
    quota = Quota.objects.prefetch_related("model_limits").get(project=project)
    verdict: Verdict = admission_verdict(project=project, quota=quota, spec=spec, now=now)
    start_now, estimated, reason, message, position = False, None, "", "", None
    placed: list[Placement] = []
    answered_by = "portal"
    if verdict.admit and spec.pool is not None and spec.pool.backend == Pool.Backend.SLURM:
        # Slurm places the work: its own answer (sbatch --test-only on the current queue)
        from scheduler.backends.slurm.submit import slurm_dry_run

        job = _hypothetical_job(spec, project, now)
        job.borrowed = verdict.borrowed
        answered_by = "slurm"
        start_now, estimated, reason, message = slurm_dry_run(
            pool=spec.pool, job=job, shards=spec.shard_count, now=now
        )
    elif verdict.admit:
        job = _hypothetical_job(spec, project, now)
        job.borrowed = verdict.borrowed
        state = build_state(now=now, extra_jobs=[job])
        decided = plan(state.snapshot, state.queue, policy_config(), ts(now))
        placed = [p for p in decided.placements if p.job_id == DRY_RUN_ID]
        if placed:
            start_now, estimated = True, now
        elif DRY_RUN_ID in decided.pending:
            pending = decided.pending[DRY_RUN_ID]
            reason, message, position = pending.reason.label, pending.message, pending.position
            estimated = from_ts(pending.estimated_start) if pending.estimated_start else None
        else:  # waits only for the preemption of lower-priority work
            reason = PendingReason.PREEMPTING.label
            message = "Lower-priority preemptible work would be stopped to make room."
    if verdict.admit and spec.dependencies:  # it waits for them first, however free the GPUs
        then = message or ("GPUs are free for it now" if start_now else "")
        words = ", ".join(f"{kind}:{job_id}" for kind, job_id in spec.dependencies)
        start_now, estimated, reason = False, None, PendingReason.DEPENDENCY.label
        message = f"It starts only after its dependencies ({words})" + (
            f"; as the cluster stands: {then}" if then else ""
        )
    if placed:
        rate, per_hour, total = _placed_quote(placed[0], spec, borrowed=verdict.borrowed)
        most = None
    else:
        candidates = _candidate_models(spec)
        rate, per_hour, total = quote(
            spec, borrowed=verdict.borrowed, candidates=candidates, shards=spec.shard_count
        )
        most = quote_most(
            spec, borrowed=verdict.borrowed, candidates=candidates, shards=spec.shard_count
        )
    return DryRun(
        admitted=verdict.admit,
        borrowed=verdict.borrowed,
        admission_reason=verdict.reason,
        quota_notes=verdict.quota_notes,
        would_start_now=start_now,
        estimated_start=estimated,
        wait_reason=reason,
        wait_message=message,
        rate_per_gpu_hour=rate,
        cost_per_hour=per_hour,
        cost_for_estimate=total,
        queue_position=position,
        cost_per_hour_most=most,
        answered_by=answered_by,
    )


def _placed_quote(
    placement: Placement, spec: JobSpec, *, borrowed: bool
) -> tuple[Decimal | None, Decimal | None, Decimal | None]:
    """The dry run's quote where it would start now: the GPUs the plan gave it, as billed
    (each shard of an array job on the like of them); the plain quote if one of those GPUs
    is gone since the plan's snapshot."""
    gpus = Gpu.objects.select_related("model").in_bulk([s.gpu_id for s in placement.shares])
    if not placement.shares or any(s.gpu_id not in gpus for s in placement.shares):
        return quote(spec, borrowed=borrowed, shards=spec.shard_count)
    shares = [
        (
            gpus[s.gpu_id].model,
            billed_share_milli(
                s.milli, gpus[s.gpu_id].capacity_milli, s.memory_mib, gpus[s.gpu_id].memory_mib
            ),
        )
        for s in placement.shares
    ]
    per_hour = shares_cost_per_hour(
        shares * spec.shard_count, preemptible=spec.preemptible or borrowed
    )
    models = {model for model, _ in shares}  # one model: its rate per GPU-hour, too
    rate = None
    if len(models) == 1:
        model = models.pop()
        rate = rates_now([model], preemptible=spec.preemptible or borrowed)[model.pk]
    return rate, per_hour, _for_estimate(per_hour, spec)


@dataclass(frozen=True)
class ModelAvailability:
    model: GpuModel
    total_gpus: int
    free_gpus: int
    queued_gpus: int
    estimated_wait: str
    rate_per_gpu_hour: Decimal | None = None  # what billing charges on demand now


AVAILABILITY_KEY = "scheduler:model-availability"
_COUNTS = ("total_gpus", "free_gpus", "queued_gpus", "estimated_wait")
AVAILABILITY_REFRESHING = "scheduler:model-availability-refreshing"
AVAILABILITY_FRESH_SECONDS = 5.0  # younger than this: served as is
AVAILABILITY_KEEP_SECONDS = 300  # older (up to this): served while a worker recomputes it


def model_availability() -> list[ModelAvailability]:
    """Per GPU model: GPUs in the fleet, whole GPUs free now, queued demand, and when a 1-GPU
    job of that model would start. Computing it plans the whole queue once per model (about
    a second with a thousand queued jobs), so pages never wait for it once it exists: a copy
    older than a few seconds is served while a Celery task computes the next one (one at a
    time); only the first page after a cold cache computes it itself."""
    cached = cache.get(AVAILABILITY_KEY)
    if isinstance(cached, dict) and isinstance(cached.get("rows"), list):
        if time.time() - float(cached.get("at", 0)) > AVAILABILITY_FRESH_SECONDS and cache.add(
            AVAILABILITY_REFRESHING, 1, timeout=30
        ):
            enqueue("scheduler.model_availability_refresh")
        return _priced(_from_rows(cached["rows"]))
    return _priced(model_availability_refresh())


def _priced(rows: list[ModelAvailability]) -> list[ModelAvailability]:
    """Each row with what billing charges on its model now (read at each page, never cached:
    a price published a second ago shows)."""
    rates = rates_now([a.model for a in rows])
    return [replace(a, rate_per_gpu_hour=rates[a.model.pk]) for a in rows]


def _from_rows(rows: list[dict[str, object]]) -> list[ModelAvailability]:
    """Plain rows (the cache holds JSON): the models read anew."""
    models = GpuModel.objects.in_bulk([row["model"] for row in rows])
    return [
        ModelAvailability(model=models[row["model"]], **{k: row[k] for k in _COUNTS})  # type: ignore[arg-type]
        for row in rows
        if row["model"] in models
    ]


def model_availability_refresh() -> list[ModelAvailability]:
    """Compute the availability now and cache it (the Celery task, or a cold cache)."""
    started = time.time()
    out = _model_availability()
    rows = [{"model": a.model.pk, **{k: getattr(a, k) for k in _COUNTS}} for a in out]
    cache.set(AVAILABILITY_KEY, {"at": started, "rows": rows}, timeout=AVAILABILITY_KEEP_SECONDS)
    cache.delete(AVAILABILITY_REFRESHING)
    return out


def _model_availability() -> list[ModelAvailability]:
    now = timezone.now()
    state = build_state(now=now)
    total: dict[str, int] = defaultdict(int)
    free: dict[str, int] = defaultdict(int)
    for node in state.snapshot.nodes:
        for gpu in node.gpus:
            if gpu.healthy:
                total[gpu.model] += 1
                if node.schedulable and gpu.used_milli == 0:
                    free[gpu.model] += 1
    queued: dict[str, int] = defaultdict(int)
    for request in state.queue:
        for name in request.models or {"(any)"}:
            queued[name] += request.total_gpus
    config = policy_config()
    out = []
    for gpu_model in GpuModel.objects.filter(is_active=True):
        wait = "none in the fleet"
        if total[gpu_model.name]:
            probe = JobSpec(name="probe", command="true", gpu_model=gpu_model)
            job = _hypothetical_job(probe, Project(slug="__probe__", name="probe"), now)
            decided = plan(state.snapshot, [*state.queue, job_request(job)], config, ts(now))
            if any(p.job_id == DRY_RUN_ID for p in decided.placements):
                wait = "starts now"
            elif DRY_RUN_ID in decided.pending and decided.pending[DRY_RUN_ID].estimated_start:
                wait = format_when(decided.pending[DRY_RUN_ID].estimated_start or 0, ts(now))
            else:
                wait = "unknown (no runtime estimates ahead)"
        out.append(
            ModelAvailability(
                model=gpu_model,
                total_gpus=total[gpu_model.name],
                free_gpus=free[gpu_model.name],
                queued_gpus=queued[gpu_model.name],
                estimated_wait=wait,
            )
        )
    return out
