"""Ports: what the scheduler (and monitoring, which reads through it) need from apps above it.

The scheduler declares each port as a `typing.Protocol`; the app that answers it registers an
implementation in its `AppConfig.ready()` (billing: prices, budgets, reserved plans, job cost;
monitoring: telemetry, allocation changes, cycle timings). The admission checks' port is
declared beside the `JobSpec` and `Verdict` it speaks of (`scheduler.admission.ADMISSION_CHECKS`).
mypy checks every registration
against the Protocol. A required port nobody registered fails `manage.py check` (and so
start-up) with `scheduler.E001`, and fails loudly if called anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from scheduler.models import GpuModel, Job, Node


class BudgetGate(Protocol):
    """Of these projects, those whose queued jobs must wait (hard budget cap, unpaid)."""

    def __call__(self, *, project_ids: set[int]) -> set[int]: ...


class PriceQuote(Protocol):
    """The rate per GPU-hour a job on each of these models (by id) is charged now, from the
    price list billing charges (pages and the API show these, never the catalog's price)."""

    def __call__(
        self, *, gpu_models: Iterable[GpuModel], preemptible: bool
    ) -> dict[int, Decimal]: ...


class SharesCost(Protocol):
    """What `(gpu_model, billed_milli)` shares cost per hour, as metering bills them (the
    billed part of a share is `scheduler.core.model.billed_share_milli`)."""

    def __call__(self, *, shares: list[tuple[GpuModel, int]], preemptible: bool) -> Decimal: ...


class JobsCost(Protocol):
    """What jobs cost (billing's one figure, to the cent) from `since` (None: ever) to `now`."""

    def __call__(
        self, job_ids: list[int], *, since: datetime | None, now: datetime
    ) -> dict[int, Decimal]: ...


class ReservedCapacity(Protocol):
    """Reserved GPUs per project slug and GPU model name in force at `now`."""

    def __call__(self, *, now: datetime) -> dict[str, dict[str, int]]: ...


class JobCost(Protocol):
    """What a job has cost so far, to the cent."""

    def __call__(self, job: Job, *, now: datetime) -> Decimal: ...


class TelemetrySink(Protocol):
    """Receives every heartbeat's telemetry (samples carry `gpu_id`)."""

    def __call__(self, *, node: Node, samples: list[dict[str, Any]], now: datetime) -> None: ...


class AllocationListener(Protocol):
    """Told that allocations on these nodes started or ended (inside the transaction)."""

    def __call__(self, *, node_ids: set[int]) -> None: ...


class CycleListener(Protocol):
    """Told that a scheduling cycle ended: how long it took, when, how many jobs it placed."""

    def __call__(self, *, seconds: float, at: float, placed: int) -> None: ...


T = TypeVar("T")


class Port(Generic[T]):
    """One implementation of a Protocol, registered by the app that provides it."""

    def __init__(self, name: str, *, provider: str, required: bool) -> None:
        self.name, self.provider, self.required = name, provider, required
        self._impl: T | None = None

    def register(self, impl: T) -> None:
        self._impl = impl

    @property
    def registered(self) -> bool:
        return self._impl is not None

    def get(self) -> T:
        if self._impl is None:
            raise ImproperlyConfigured(_missing(self))
        return self._impl

    @contextmanager
    def override(self, impl: T | None) -> Iterator[None]:
        """Another implementation (or none) for the duration of a block: tests."""
        saved, self._impl = self._impl, impl
        try:
            yield
        finally:
            self._impl = saved


class Hub(Generic[T]):
    """Any number of implementations (listeners, sinks, checks), called in registration order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._impls: list[T] = []

    def register(self, impl: T) -> None:
        if impl not in self._impls:  # ready() may run twice (tests)
            self._impls.append(impl)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._impls))

    def __bool__(self) -> bool:
        return bool(self._impls)

    @contextmanager
    def override(self, impls: Iterable[T]) -> Iterator[None]:
        saved, self._impls = self._impls, list(impls)
        try:
            yield
        finally:
            self._impls = saved


def _missing(port: Port[Any]) -> str:
    return (
        f"No implementation registered for the scheduler port '{port.name}': "
        f"the {port.provider} app registers it in its AppConfig.ready(); "
        f"is '{port.provider}' in INSTALLED_APPS?"
    )


PRICE_QUOTE: Port[PriceQuote] = Port("price quote", provider="billing", required=True)
SHARES_COST: Port[SharesCost] = Port("shares cost", provider="billing", required=True)
JOB_COST: Port[JobCost] = Port("job cost", provider="billing", required=True)
JOBS_COST: Port[JobsCost] = Port("jobs cost", provider="billing", required=True)
BUDGET_GATE: Port[BudgetGate] = Port("budget gate", provider="billing", required=True)
# of these projects, those at a hard budget cap: their non-preemptible queued jobs wait
BUDGET_CAPPED: Port[BudgetGate] = Port("budget capped", provider="billing", required=True)
RESERVED_CAPACITY: Port[ReservedCapacity] = Port(
    "reserved capacity", provider="billing", required=True
)
TELEMETRY_SINKS: Hub[TelemetrySink] = Hub("telemetry sinks")
ALLOCATION_LISTENERS: Hub[AllocationListener] = Hub("allocation listeners")
CYCLE_LISTENERS: Hub[CycleListener] = Hub("cycle listeners")

PORTS: tuple[Port[Any], ...] = (
    PRICE_QUOTE,
    SHARES_COST,
    JOB_COST,
    JOBS_COST,
    BUDGET_GATE,
    BUDGET_CAPPED,
    RESERVED_CAPACITY,
)


def allocations_changed(*, node_ids: Iterable[int]) -> None:
    """Tell the allocation listeners (nothing to tell for no nodes)."""
    ids = set(node_ids)
    if not ids:
        return
    for listener in ALLOCATION_LISTENERS:
        listener(node_ids=ids)


def check_required_ports(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """System check: every required port has an implementation."""
    return [
        checks.Error(_missing(port), id="scheduler.E001", obj=f"scheduler.ports.{port.name}")
        for port in PORTS
        if port.required and not port.registered
    ]
