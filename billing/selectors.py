"""Billing reads, scoped to what the user may see: another tenant's data is 404."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, Max, Min, Q, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from billing import pricing
from billing.models import (
    UNISSUED_STATUSES,
    BillingAccount,
    Budget,
    Invoice,
    InvoiceLine,
    Notification,
    PriceVersion,
    ProjectBilling,
    ReservedPlan,
    StoragePrice,
    StorageUsageRecord,
    Tier,
    UsageRecord,
)
from billing.pricing import period_bounds
from billing.rates import PriceTable
from foundation.db import CompiledQuery
from portal.errors import DomainError, NotFound
from portal.models import Project, User
from portal.selectors import project_list_visible_to
from scheduler.models import Allocation, Gpu, GpuModel, Job, JobEvent, JobState, Node

ZERO = Decimal(0)
CAP_ACTOR = "billing"  # the actor of the preemptions a hard budget cap makes
MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


def month_param(raw: str | None, *, now: datetime | None = None) -> date:
    """A `YYYY-MM` query parameter as the month's first day (default: this month)."""
    now = now or timezone.now()
    if not raw:
        return pricing.month_start(now).date()
    match = MONTH_RE.match(raw.strip())
    if (
        match is None
        or not 1 <= int(match.group(2)) <= 12
        or not 2000 <= int(match.group(1)) <= 2200
    ):
        raise DomainError("month must be YYYY-MM, e.g. 2025-06.", field="month")
    return date(int(match.group(1)), int(match.group(2)), 1)


# ---- prices ---------------------------------------------------------------------------------


def _unpriced_rate(gpu_model: GpuModel, *, preemptible: bool) -> Decimal:
    """A model without a price version yet: the version metering seeds for it before it bills
    (`price_list_seed`: its catalog price, the default preemptible discount)."""
    return pricing.effective_rate(
        on_demand=gpu_model.price_per_gpu_hour,
        preemptible=preemptible,
        preemptible_discount=PriceVersion.default_preemptible_discount(),
    )


def rates_now(
    *,
    gpu_models: Iterable[GpuModel],
    preemptible: bool,
    table: PriceTable | None = None,
    now: datetime | None = None,
) -> dict[int, Decimal]:
    """The scheduler port `PRICE_QUOTE`: the rate per GPU-hour each model (by id) is charged
    at `now`, as metering charges it: the price version in force (the price list read once),
    else the version metering would seed. Every price a page or the API shows comes from
    here, never from the catalog's list price, which a published price overrides."""
    table = table or PriceTable.load()
    now = now or timezone.now()
    out: dict[int, Decimal] = {}
    for model in gpu_models:
        version = table.at(model.pk, now)
        out[model.pk] = (
            version.rate(preemptible=preemptible)
            if version is not None
            else _unpriced_rate(model, preemptible=preemptible)
        )
    return out


def quote_rate(*, gpu_model: GpuModel, preemptible: bool) -> Decimal:
    """The rate a job on this model is charged now (`rates_now` for one model)."""
    return rates_now(gpu_models=[gpu_model], preemptible=preemptible)[gpu_model.pk]


def shares_cost_per_hour(
    *,
    shares: list[tuple[GpuModel, int]],
    preemptible: bool,
    table: PriceTable | None = None,
    now: datetime | None = None,
) -> Decimal:
    """The scheduler's `SHARES_COST` port (registered in billing/apps.py): what
    `(gpu_model, billed_milli)` shares cost per hour at `now` (the billed part as metering bills
    it, `scheduler.core.model.billed_share_milli`) at the price version in force (the price list
    read once, `table` if given)."""
    table = table or PriceTable.load()
    now = now or timezone.now()
    total = ZERO
    for model, billed in shares:
        version = table.at(model.pk, now)
        rate = (
            version.rate(preemptible=preemptible)
            if version is not None
            else _unpriced_rate(model, preemptible=preemptible)
        )
        total += rate * billed / pricing.MILLI
    return total


def price_list(*, now: datetime | None = None) -> list[PriceVersion]:
    """The price in effect now for each model, and any scheduled change after it."""
    now = now or timezone.now()
    rows = list(
        PriceVersion.objects.select_related("gpu_model").order_by(
            "gpu_model__name", "effective_from"
        )
    )
    out: list[PriceVersion] = []
    by_model: dict[int, list[PriceVersion]] = defaultdict(list)
    for v in rows:
        by_model[v.gpu_model_id].append(v)
    for versions in by_model.values():
        current = [v for v in versions if v.effective_from <= now]
        out += current[-1:] + [v for v in versions if v.effective_from > now]
    return out


def storage_price_list(*, now: datetime | None = None) -> list[StoragePrice]:
    """The storage price in effect now (per GB-month), and any scheduled change after it."""
    now = now or timezone.now()
    versions = list(StoragePrice.objects.order_by("effective_from"))
    current = [v for v in versions if v.effective_from <= now]
    return current[-1:] + [v for v in versions if v.effective_from > now]


# ---- accounts and spend ---------------------------------------------------------------------


def account_of(*, project: Project) -> BillingAccount | None:
    link = ProjectBilling.objects.select_related("account").filter(project=project).first()
    return link.account if link is not None else None


def stopped_by_budget_cap(alloc: Allocation) -> bool:
    """Whether the allocation's job was preempted by its budget's hard cap: the customer's
    budget, not a platform fault, so the fault policy does not credit it."""
    span = (alloc.pk, alloc.job_id, alloc.started_at, alloc.ended_at)
    return alloc.pk in stopped_by_budget_cap_among([span])


def stopped_by_budget_cap_among(
    spans: Sequence[tuple[int, int, datetime, datetime | None]],
) -> set[int]:
    """`stopped_by_budget_cap` for many allocations in one read: of the spans (allocation
    id, job id, started, ended or None while running), the allocation ids whose job a hard
    budget cap preempted within the span."""
    if not spans:
        return set()
    now = timezone.now()
    stops: dict[int, list[datetime]] = defaultdict(list)
    for job_id, at in JobEvent.objects.filter(
        job_id__in={job_id for _, job_id, _, _ in spans},
        to_state=JobState.PREEMPTING,
        actor_label=CAP_ACTOR,
        created_at__gte=min(start for _, _, start, _ in spans),
    ).values_list("job_id", "created_at"):
        stops[job_id].append(at)
    return {
        pk
        for pk, job_id, start, end in spans
        if any(start <= at <= (end or now) for at in stops.get(job_id, ()))
    }


def _fault_credited(alloc: Allocation) -> bool:
    """The fault policy (`pricing.fault_credited`) for an ended allocation."""
    credited = pricing.fault_credited(
        end_reason=alloc.end_reason,
        preemptible=alloc.job.preemptible or alloc.borrowed,
        has_checkpoint=bool(alloc.job.checkpoint),
        corroborated=alloc.fault_corroborated_at is not None,
    )
    if credited and alloc.end_reason == Allocation.EndReason.PREEMPTED:
        return not stopped_by_budget_cap(alloc)
    return credited


def _open_usage(
    allocs: QuerySet[Allocation], *, since: datetime | None, now: datetime
) -> list[tuple[Allocation, Decimal, int]]:
    """(allocation, amount, milli-seconds) of what is used but not yet metered: the open hour
    of running allocations, or an ended one the meter has not reached. An estimate at the
    current price; the ledger replaces it within the hour."""
    table = PriceTable.load()
    out = []
    end_now = pricing.floor_second(now)
    for alloc in allocs.filter(Q(meter__isnull=True) | Q(meter__done=False)).select_related(
        "job", "gpu", "meter"
    ):
        meter = getattr(alloc, "meter", None)
        begin = pricing.floor_second(alloc.started_at)
        if meter is not None:
            begin = max(begin, meter.metered_until)
        if since is not None:
            begin = max(begin, since)
        end = pricing.floor_second(alloc.ended_at) if alloc.ended_at else end_now
        if end <= begin:
            continue
        preemptible = alloc.job.preemptible or alloc.borrowed
        if alloc.ended_at is not None and _fault_credited(alloc):
            continue
        version = table.at(alloc.gpu_model_id, begin)
        rate = (
            version.rate(preemptible=preemptible)
            if version is not None
            else _unpriced_rate(alloc.gpu_model, preemptible=preemptible)
        )
        billed = alloc.billed_share()
        ms = int((end - begin).total_seconds()) * billed
        out.append((alloc, pricing.usage_amount(ms, rate), ms))
    return out


def project_spend(*, project_ids: set[int], now: datetime | None = None) -> dict[int, Decimal]:
    """Billable spend this month per project: metered records (less fault credits) plus the
    open, not yet metered hour."""
    now = now or timezone.now()
    start = pricing.month_start(now)
    spend: dict[int, Decimal] = defaultdict(lambda: ZERO)
    if not project_ids:
        return spend
    for pid, amount in (
        UsageRecord.objects.filter(
            project_id__in=project_ids, period_start=start.date(), fault_credit=False
        )
        .values_list("project_id")
        .annotate(total=Sum("amount"))
        .values_list("project_id", "total")
    ):
        spend[pid] += amount or ZERO
    allocs = Allocation.objects.filter(job__project_id__in=project_ids, started_at__lt=now).exclude(
        ended_at__lt=start
    )
    for alloc, amount, _ in _open_usage(allocs, since=start, now=now):
        spend[alloc.job.project_id] += amount
    # storage is billed, so it is spent: volumes' metered GB-months of this month count
    for pid, amount in (
        StorageUsageRecord.objects.filter(project_id__in=project_ids, period_start=start.date())
        .values_list("project_id")
        .annotate(total=Sum("amount"))
        .values_list("project_id", "total")
    ):
        spend[pid] += amount or ZERO
    return spend


def jobs_cost(
    job_ids: list[int],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> dict[int, Decimal]:
    """THE cost of jobs, the one figure every page shows (job page, usage page, efficiency
    pages, the invoice's jobs): per job, its billable usage records (after reserved coverage,
    less fault credits) whose slice starts in [since, until), plus what it used that is not
    metered yet (the open hour, at the current price), summed exactly and rounded once to
    the cent (ROUND_HALF_UP). Records slice at hour boundaries, so a window is best given in
    whole hours (months are)."""
    now = now or timezone.now()
    exact: dict[int, Decimal] = {job_id: ZERO for job_id in job_ids}
    if not exact:
        return {}
    records = UsageRecord.objects.filter(job_id__in=list(exact), fault_credit=False)
    if since is not None:
        records = records.filter(slice_start__gte=since)
    if until is not None:
        records = records.filter(slice_start__lt=until)
    for job_id, total in (
        records.values_list("job_id").annotate(total=Sum("amount")).values_list("job_id", "total")
    ):
        exact[job_id] += total or ZERO
    if until is None or until > now:
        allocs = Allocation.objects.filter(job_id__in=list(exact), started_at__lt=now)
        if since is not None:
            allocs = allocs.exclude(ended_at__lt=since)
        for alloc, amount, _ in _open_usage(allocs, since=since, now=now):
            exact[alloc.job_id] += amount
    return {job_id: pricing.to_cents(amount) for job_id, amount in exact.items()}


def project_burn_per_hour(*, project_id: int, now: datetime | None = None) -> Decimal:
    """What the project's running allocations and held volumes cost per hour now, as
    metering bills them."""
    table = PriceTable.load()
    now = now or timezone.now()
    return storage_burn_per_hour(project_id=project_id, now=now) + sum(
        (
            shares_cost_per_hour(
                shares=[(alloc.gpu_model, alloc.billed_share())],
                preemptible=alloc.job.preemptible or alloc.borrowed,
                table=table,
                now=now,
            )
            for alloc in Allocation.objects.filter(
                job__project_id=project_id, ended_at__isnull=True, started_at__lt=now
            ).select_related("job", "gpu", "gpu_model")
        ),
        ZERO,
    )


def storage_burn_per_hour(*, project_id: int, now: datetime) -> Decimal:
    """What the project's metered volumes (all but scratch) cost per hour at the storage
    price in effect now: GiB of size limit × price per GB-month / 730 h."""
    from storage.models import Volume, VolumeKind

    gib = (
        Volume.objects.filter(project_id=project_id, deleted_at__isnull=True, created_at__lt=now)
        .exclude(kind=VolumeKind.SCRATCH)
        .aggregate(total=Sum("size_gib"))["total"]
    )
    if not gib:
        return ZERO
    price = StoragePrice.objects.filter(effective_from__lte=now).order_by("-effective_from").first()
    if price is None:
        return ZERO
    return (
        Decimal(gib)
        * price.per_gib_month
        * pricing.SECONDS_PER_HOUR
        / pricing.STORAGE_MONTH_SECONDS
    )


def job_cost(job: Job, *, now: datetime | None = None) -> Decimal:
    """What a job has cost so far (all months, less fault credits), to the cent: `jobs_cost`."""
    return jobs_cost([job.pk], now=now)[job.pk]


def jobs_cost_port(
    job_ids: list[int], *, since: datetime | None, now: datetime
) -> dict[int, Decimal]:
    """The scheduler port `JOBS_COST` (monitoring's efficiency pages): `jobs_cost`."""
    return jobs_cost(job_ids, since=since, now=now)


# Fast path (`bench.cycle_cost`: the cycle's fixed cost): every cycle that plans reads it, and
# building the queryset cost more CPU than answering it.
_ACTIVE_PLANS = CompiledQuery(
    lambda now: ReservedPlan.objects.filter(starts_at__lte=now, ends_at__gt=now).values_list(
        "account_id", "project__slug", "gpu_model__name", "gpus"
    )
)


def reserved_gpus_by_project(*, now: datetime | None = None) -> dict[str, dict[str, int]]:
    """Scheduler snapshot: project slug → GPU model name → GPUs guaranteed by active reserved
    plans (a plan without a project belongs to its account's only project)."""
    plans = _ACTIVE_PLANS.rows(now=now or timezone.now())
    sole: dict[int, str] = {}
    unassigned = {account_id for account_id, project_slug, _, _ in plans if project_slug is None}
    if unassigned:
        links = defaultdict(list)
        for account_id, project_slug in ProjectBilling.objects.filter(
            account_id__in=unassigned
        ).values_list("account_id", "project__slug"):
            links[account_id].append(project_slug)
        sole = {a: slugs[0] for a, slugs in links.items() if len(slugs) == 1}
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for account_id, project_slug, model_name, gpus in plans:
        slug: str | None = project_slug if project_slug is not None else sole.get(account_id)
        if slug is None:
            continue
        out[slug][model_name] = out[slug].get(model_name, 0) + gpus
    return dict(out)


def budget_of(*, project: Project) -> Budget | None:
    return Budget.objects.filter(project=project).first()


def notification_list(*, project: Project, limit: int = 10) -> list[Notification]:
    return list(Notification.objects.filter(project=project)[:limit])


# ---- usage pages ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRow:
    model: str
    tier: str
    gpu_hours: Decimal
    covered_hours: Decimal
    amount: Decimal
    credited: Decimal


@dataclass(frozen=True)
class JobRow:
    job_id: int
    name: str
    gpu_hours: Decimal
    amount: Decimal


@dataclass(frozen=True)
class VolumeRow:
    """A volume's storage this month: GB-months of its size limit and what they cost."""

    volume: str
    kind: str
    size_gib: int
    gb_months: Decimal
    amount: Decimal


@dataclass(frozen=True)
class DayRow:
    day: date
    gpu_hours: Decimal
    amount: Decimal


@dataclass
class UsageSummary:
    project: Project
    period_start: date
    metered: Decimal = ZERO
    credited: Decimal = ZERO
    open_estimate: Decimal = ZERO
    burn_per_hour: Decimal = ZERO
    forecast: Decimal | None = None
    running_month: bool = False
    by_model: list[ModelRow] = field(default_factory=list)
    by_job: list[JobRow] = field(default_factory=list)
    by_day: list[DayRow] = field(default_factory=list)
    by_volume: list[VolumeRow] = field(default_factory=list)
    storage: Decimal = ZERO
    budget: Budget | None = None

    @property
    def to_date(self) -> Decimal:
        return pricing.to_cents(self.metered + self.open_estimate)

    @property
    def budget_percent(self) -> int:
        if self.budget is None:
            return 0
        return min(100, int(self.to_date * 100 / self.budget.monthly_amount))

    @property
    def day_max(self) -> Decimal:
        return max((d.amount for d in self.by_day), default=ZERO)


def usage_summary(
    *, project: Project, period_start: date, now: datetime | None = None, jobs: int = 50
) -> UsageSummary:
    """A project's usage and cost for a month: by model, by job, by day; the open hour as an
    estimate; a run-rate forecast while the month runs."""
    now = now or timezone.now()
    start, end = period_bounds(period_start)
    summary = UsageSummary(
        project=project, period_start=period_start, budget=budget_of(project=project)
    )
    records = UsageRecord.objects.filter(project=project, period_start=period_start)
    _summary_by_model(summary, records)
    _summary_by_job(summary, records, start=start, end=end, now=now, jobs=jobs)
    _summary_by_day(summary, records)
    _add_storage(summary)
    summary.metered = pricing.to_cents(summary.metered)
    summary.credited = pricing.to_cents(summary.credited)
    if start <= now < end:
        _summary_running_month(summary, start=start, end=end, now=now)
    return summary


_BILLABLE = Q(fault_credit=False)


def _summary_by_model(summary: UsageSummary, records: QuerySet[UsageRecord]) -> None:
    """GPU-hours and cost by model and tier; the month's metered and credited totals."""
    for row in (
        records.values("gpu_model__name", "tier")
        .annotate(
            ms=Sum("milli_seconds"),
            cov=Sum("covered_milli_seconds"),
            cost=Sum("amount", filter=_BILLABLE),
            credited_cost=Sum("amount", filter=~_BILLABLE),
        )
        .order_by("gpu_model__name", "tier")
    ):
        summary.by_model.append(
            ModelRow(
                model=row["gpu_model__name"],
                tier=Tier(row["tier"]).label,
                gpu_hours=pricing.gpu_hours(row["ms"] or 0),
                covered_hours=pricing.gpu_hours(row["cov"] or 0),
                amount=pricing.to_cents(row["cost"] or ZERO),
                credited=pricing.to_cents(row["credited_cost"] or ZERO),
            )
        )
        summary.metered += row["cost"] or ZERO
        summary.credited += row["credited_cost"] or ZERO


def _summary_by_job(
    summary: UsageSummary,
    records: QuerySet[UsageRecord],
    *,
    start: datetime,
    end: datetime,
    now: datetime,
    jobs: int,
) -> None:
    """The `jobs` costliest jobs, each with its cost as every page shows it (`jobs_cost`: the
    open hour included)."""
    job_rows = list(
        records.values("job_id", "job__name")
        .annotate(ms=Sum("milli_seconds"), cost=Sum("amount", filter=_BILLABLE))
        .order_by("-cost", "job_id")[:jobs]
    )
    costs = jobs_cost([r["job_id"] for r in job_rows], since=start, until=end, now=now)
    for job_row in job_rows:
        summary.by_job.append(
            JobRow(
                job_id=job_row["job_id"],
                name=job_row["job__name"],
                gpu_hours=pricing.gpu_hours(job_row["ms"] or 0),
                amount=costs[job_row["job_id"]],
            )
        )


def _summary_by_day(summary: UsageSummary, records: QuerySet[UsageRecord]) -> None:
    """GPU-hours and cost by UTC day."""
    for day_row in (
        records.annotate(day=TruncDate("slice_start", tzinfo=UTC))
        .values("day")
        .annotate(ms=Sum("milli_seconds"), cost=Sum("amount", filter=_BILLABLE))
        .order_by("day")
    ):
        summary.by_day.append(
            DayRow(
                day=day_row["day"],
                gpu_hours=pricing.gpu_hours(day_row["ms"] or 0),
                amount=pricing.to_cents(day_row["cost"] or ZERO),
            )
        )


def _summary_running_month(
    summary: UsageSummary, *, start: datetime, end: datetime, now: datetime
) -> None:
    """While the month runs: the open hour's estimate, the burn rate, the month's forecast."""
    summary.running_month = True
    allocs = Allocation.objects.filter(job__project=summary.project, started_at__lt=now).exclude(
        ended_at__lt=start
    )
    open_rows = _open_usage(allocs, since=start, now=now)
    summary.open_estimate = pricing.to_cents(pricing.sum_amounts(a for _, a, _ in open_rows))
    table = PriceTable.load()
    burn = storage_burn_per_hour(project_id=summary.project.pk, now=now) + sum(
        (
            shares_cost_per_hour(
                shares=[(alloc.gpu_model, alloc.billed_share())],
                preemptible=alloc.job.preemptible or alloc.borrowed,
                table=table,
                now=now,
            )
            for alloc in allocs.filter(ended_at__isnull=True).select_related(
                "job", "gpu", "gpu_model"
            )
        ),
        ZERO,
    )
    summary.burn_per_hour = pricing.to_cents(burn)
    summary.forecast = pricing.forecast_month(
        to_date=summary.to_date,
        elapsed_seconds=int((now - start).total_seconds()),
        month_seconds=int((end - start).total_seconds()),
    )


def _add_storage(summary: UsageSummary) -> None:
    """Storage metered this month, by volume (datasets included, each once), into the total."""
    for row in (
        StorageUsageRecord.objects.filter(
            project=summary.project, period_start=summary.period_start
        )
        .values("volume_id", "volume__name", "volume__kind", "volume__is_dataset")
        .annotate(gs=Sum("gib_seconds"), cost=Sum("amount"), size=Max("size_gib"))
        .order_by("volume__name", "volume_id")
    ):
        summary.by_volume.append(
            VolumeRow(
                volume=row["volume__name"],
                kind="dataset" if row["volume__is_dataset"] else row["volume__kind"],
                size_gib=row["size"],
                gb_months=pricing.gb_months(row["gs"] or 0),
                amount=pricing.to_cents(row["cost"] or ZERO),
            )
        )
        summary.storage += row["cost"] or ZERO
    summary.metered += summary.storage
    summary.storage = pricing.to_cents(summary.storage)


def storage_records_for_csv(
    *, project: Project, period_start: date
) -> QuerySet[StorageUsageRecord]:
    """The project's storage records of a month, for the usage CSV."""
    return (
        StorageUsageRecord.objects.filter(project=project, period_start=period_start)
        .select_related("project", "volume", "invoice")
        .order_by("slice_start", "pk")
    )


def invoice_volume_summary(*, invoice: Invoice) -> list[dict[str, Any]]:
    """The storage on an invoice by project and volume: size limit, GB-months, amount."""
    rows: list[dict[str, Any]] = [
        dict(row)
        for row in StorageUsageRecord.objects.filter(invoice=invoice)
        .values("project__slug", "volume_id", "volume__name", "volume__kind", "volume__is_dataset")
        .annotate(gs=Sum("gib_seconds"), cost=Sum("amount"), size=Max("size_gib"))
        .order_by("project__slug", "volume__name", "volume_id")
    ]
    for row in rows:
        row["kind"] = "dataset" if row["volume__is_dataset"] else row["volume__kind"]
        row["gb_months"] = pricing.gb_months(row["gs"] or 0)
        row["amount"] = pricing.to_cents(row["cost"] or ZERO)
    return rows


def usage_records_for_export(*, project: Project, period_start: date) -> QuerySet[UsageRecord]:
    return (
        UsageRecord.objects.filter(project=project, period_start=period_start)
        .select_related("gpu_model", "job", "account", "price_version", "project", "invoice")
        .order_by("slice_start", "pk")
    )


def storage_records_for_export(
    *, project: Project, period_start: date, invoice: Invoice
) -> QuerySet[StorageUsageRecord]:
    """The project's storage records of the month on `invoice` (the open month's draft)."""
    return StorageUsageRecord.objects.filter(
        project=project, period_start=period_start, invoice=invoice
    )


# ---- invoices -------------------------------------------------------------------------------


def invoice_list_visible_to(*, user: User) -> QuerySet[Invoice]:
    """Invoices of accounts that bill a project the user may see."""
    projects = project_list_visible_to(user=user)
    return (
        Invoice.objects.filter(account__project_links__project__in=projects)
        .exclude(status__in=UNISSUED_STATUSES)
        .select_related("account")
        .distinct()
        .order_by("-period_start", "pk")
    )


def invoice_list_for_project(*, project: Project) -> QuerySet[Invoice]:
    return (
        Invoice.objects.filter(account__project_links__project=project)
        .exclude(status__in=UNISSUED_STATUSES)
        .select_related("account")
        .order_by("-period_start", "pk")
    )


def invoice_of_month(*, project: Project, period_start: date) -> Invoice | None:
    """The invoice (or open draft) of the project's account for a month, if any."""
    return (
        Invoice.objects.filter(account__project_links__project=project, period_start=period_start)
        .exclude(status=Invoice.Status.NOTHING)
        .select_related("account")
        .first()
    )


def invoice_get_visible(*, user: User, invoice_id: int) -> Invoice:
    invoice = invoice_list_visible_to(user=user).filter(pk=invoice_id).first()
    if invoice is None:
        raise NotFound("No such invoice.")
    return invoice


def line_records(*, line: InvoiceLine) -> QuerySet[UsageRecord]:
    """The usage records behind a usage, covered or credit line (none for other kinds)."""
    qs = UsageRecord.objects.filter(invoice_id=line.invoice_id).select_related("job", "gpu_model")
    kind = InvoiceLine.Kind
    if line.kind == kind.COVERED:
        return qs.filter(
            gpu_model_id=line.gpu_model_id,
            covered_milli_seconds__gt=0,
            period_start=line.invoice.period_start,
        )
    if line.kind == kind.FAULT_CREDIT and line.unit_price is not None:
        return qs.filter(
            gpu_model_id=line.gpu_model_id,
            tier=line.tier,
            rate=line.unit_price,
            period_start=line.usage_period_start or line.invoice.period_start,
            fault_credit=True,
            amount__gt=0,
        )
    if line.kind in (kind.USAGE, kind.PREEMPTIBLE, kind.LATE_USAGE) and line.unit_price is not None:
        return qs.filter(milli_seconds__gt=F("covered_milli_seconds")).filter(
            gpu_model_id=line.gpu_model_id,
            tier=line.tier,
            rate=line.unit_price,
            period_start=line.usage_period_start or line.invoice.period_start,
        )
    return qs.none()


def invoice_job_summary(*, invoice: Invoice) -> list[dict[str, object]]:
    """Per job: GPU-hours and billable amount on the invoice (traceability). Billable
    excludes what fault credits gave back (the invoice's credit lines offset exactly that)."""
    rows: list[dict[str, object]] = [
        dict(row)
        for row in UsageRecord.objects.filter(invoice=invoice)
        .values("job_id", "job__name", "project__slug", "gpu_model__name")
        .annotate(
            ms=Sum("milli_seconds"),
            # billable, as `jobs_cost` counts it: fault-credited records are not
            cost=Sum("amount", filter=Q(fault_credit=False), default=ZERO),
            records=Count("id"),
        )
        .order_by("project__slug", "job_id", "gpu_model__name")
    ]
    # Each attempt of a job as a period on so many GPUs (an elastic job resized from 8 GPUs to
    # 2 shows both), first to last metered second.
    periods: dict[tuple[object, object], list[dict[str, object]]] = defaultdict(list)
    for p in (
        UsageRecord.objects.filter(invoice=invoice)
        .values("job_id", "gpu_model__name", "allocation__attempt")
        .annotate(
            gpus=Count("allocation_id", distinct=True),
            start=Min("slice_start"),
            end=Max("slice_end"),
        )
        .order_by("job_id", "start")
    ):
        periods[(p["job_id"], p["gpu_model__name"])].append(
            {"gpus": p["gpus"], "start": p["start"], "end": p["end"]}
        )
    for row in rows:
        row["periods"] = periods.get((row["job_id"], row["gpu_model__name"]), [])
    return rows


# ---- operators ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RevenueRow:
    model: str
    fleet_gpus: int
    gpu_hours_sold: Decimal
    utilization_percent: Decimal
    usage_revenue: Decimal
    reserved_revenue: Decimal
    credited: Decimal

    @property
    def revenue(self) -> Decimal:
        return self.usage_revenue + self.reserved_revenue


def revenue_by_model(*, period_start: date, now: datetime | None = None) -> list[RevenueRow]:
    """Per GPU model for a month: GPU-hours sold, utilization of the fleet's GPU-hours,
    revenue from usage and reserved fees (to date in the running month)."""
    now = now or timezone.now()
    start, end = period_bounds(period_start)
    upto = min(max(now, start), end)
    elapsed = int((upto - start).total_seconds())
    usage: dict[int, dict[str, Any]] = {
        row["gpu_model_id"]: dict(row)
        for row in UsageRecord.objects.filter(period_start=period_start)
        .values("gpu_model_id")
        .annotate(
            ms=Sum("milli_seconds"),
            cost=Sum("amount", filter=Q(fault_credit=False)),
            credited_cost=Sum("amount", filter=Q(fault_credit=True)),
        )
    }
    fleet = dict(
        Gpu.objects.exclude(node__state=Node.State.RETIRED)
        .values_list("model_id")
        .annotate(n=Count("id"))
        .values_list("model_id", "n")
    )
    reserved: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for plan in ReservedPlan.objects.filter(starts_at__lt=upto, ends_at__gt=start):
        for _, fee in pricing.plan_fees(
            starts_at=plan.starts_at,
            ends_at=plan.ends_at,
            monthly_fee=plan.monthly_fee,
            start=start,
            end=upto,
        ):
            reserved[plan.gpu_model_id] += fee
    rows = []
    for model in GpuModel.objects.filter(pk__in=set(usage) | set(fleet) | set(reserved)).order_by(
        "name"
    ):
        u: dict[str, Any] = usage.get(model.pk, {})
        ms = int(u.get("ms") or 0)
        gpus = fleet.get(model.pk, 0)
        capacity = gpus * elapsed * pricing.MILLI
        util = (Decimal(ms) * 100 / capacity).quantize(Decimal("0.1")) if capacity else ZERO
        rows.append(
            RevenueRow(
                model=model.name,
                fleet_gpus=gpus,
                gpu_hours_sold=pricing.gpu_hours(ms),
                utilization_percent=util,
                usage_revenue=pricing.to_cents(u.get("cost") or ZERO),
                reserved_revenue=reserved.get(model.pk, ZERO),
                credited=pricing.to_cents(u.get("credited_cost") or ZERO),
            )
        )
    return rows
