"""Extension points that let apps above the scheduler (billing) take part without a cycle.

Settings name dotted paths; the scheduler calls them and never imports those apps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from decimal import Decimal
from functools import cache
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string


@cache
def _load(path: str) -> Callable[..., Any]:
    fn: Callable[..., Any] = import_string(path)
    return fn


def shares_cost_per_hour(*, shares: list[tuple[Any, int, int]], preemptible: bool) -> Decimal:
    """What `(gpu_model, share_milli, capacity_milli)` shares cost per hour: billing's rule
    (its rates, for the part of the device each share is billed as) when installed, else the
    catalog price for each share's part of its device."""
    path = getattr(settings, "SCHEDULER_SHARES_COST", "")
    if path:
        cost: Decimal = _load(path)(shares=shares, preemptible=preemptible)
        return cost
    return sum(
        (
            price_per_gpu_hour(gpu_model=model, preemptible=preemptible)
            * min(share, capacity)
            / capacity
            for model, share, capacity in shares
        ),
        Decimal(0),
    )


def admission_checks() -> list[Callable[..., Any]]:
    """Callables `check(*, project, spec, now) -> AdmissionVerdict | None`."""
    return [_load(p) for p in getattr(settings, "SCHEDULER_ADMISSION_CHECKS", [])]


def projects_over_budget(project_ids: set[int]) -> set[int]:
    """Projects whose hard budget cap stops new work (billing answers; none without it)."""
    path = getattr(settings, "SCHEDULER_BUDGET_EXHAUSTED", "")
    if not path:
        return set()
    result: set[int] = _load(path)(project_ids=project_ids)
    return result


def telemetry_sinks() -> list[Callable[..., Any]]:
    """Callables `sink(*, node, samples, now)` that receive every heartbeat's telemetry."""
    return [_load(p) for p in getattr(settings, "SCHEDULER_TELEMETRY_SINKS", [])]


def allocation_listeners() -> list[Callable[..., Any]]:
    """Callables `listener(*, node_ids)` told that allocations on those nodes started or ended."""
    return [_load(p) for p in getattr(settings, "SCHEDULER_ALLOCATION_LISTENERS", [])]


def allocations_changed(*, node_ids: Iterable[int]) -> None:
    ids = set(node_ids)
    if not ids:
        return
    for listener in allocation_listeners():
        listener(node_ids=ids)


def reserved_gpus_by_project(now: Any) -> dict[str, dict[str, int]]:
    """Reserved GPUs per project slug and model name (billing's reserved plans)."""
    path = getattr(settings, "SCHEDULER_RESERVED_CAPACITY", "")
    if not path:
        return {}
    result: dict[str, dict[str, int]] = _load(path)(now=now)
    return result


def price_per_gpu_hour(*, gpu_model: Any, preemptible: bool) -> Decimal:
    """The rate a job would pay; billing's price list when installed, else the catalog price."""
    path = getattr(settings, "SCHEDULER_PRICE_QUOTE", "")
    if path:
        rate: Decimal = _load(path)(gpu_model=gpu_model, preemptible=preemptible)
        return rate
    base: Decimal = gpu_model.price_per_gpu_hour
    if preemptible:
        base = base * (1 - Decimal(str(settings.PREEMPTIBLE_DISCOUNT)))
    return base.quantize(Decimal("0.0001"))
