"""Billing writes: accounts, prices and plans, metering, coverage, budgets, invoices, emails,
Stripe sync and webhooks. Each public service is `<entity>_<verb>(*, ...)` and audited."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Q, Sum
from django.template.loader import render_to_string
from django.utils import timezone

from billing import gateway, pricing
from billing.models import (
    Adjustment,
    AllocationMeter,
    BillingAccount,
    Budget,
    BudgetAlert,
    CreditApplication,
    CreditGrant,
    Invoice,
    InvoiceLine,
    Notification,
    PriceVersion,
    ProjectBilling,
    ReservedPlan,
    StripeEvent,
    Tier,
    UsageRecord,
)
from billing.pricing import period_bounds, period_of
from billing.rates import PriceTable
from portal.audit import audit_record
from portal.enqueue import enqueue
from portal.errors import Conflict, DomainError, NotFound
from portal.models import Membership, Project, Role, User
from portal.services import require_role
from scheduler.core.model import device_share_milli
from scheduler.models import Allocation, GpuModel

log = logging.getLogger(__name__)

PRICE_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
MAX_MONEY = Decimal("10000000000")


# ---- accounts -----------------------------------------------------------------------------


def accounts_for_projects(project_ids: set[int]) -> dict[int, int]:
    """project id → billing account id, opening a pay-as-you-go account for any project that
    has none (one account per project by default)."""
    links = dict(
        ProjectBilling.objects.filter(project_id__in=project_ids).values_list(
            "project_id", "account_id"
        )
    )
    for project in Project.objects.filter(pk__in=project_ids - set(links)):
        links[project.pk] = account_open_for_project(project=project).pk
    return links


@transaction.atomic
def account_open_for_project(*, project: Project, actor: User | None = None) -> BillingAccount:
    """The project's billing account, opened on first use."""
    link = ProjectBilling.objects.select_related("account").filter(project=project).first()
    if link is not None:
        return link.account
    Project.objects.select_for_update().get(pk=project.pk)  # one opener per project
    link = ProjectBilling.objects.select_related("account").filter(project=project).first()
    if link is not None:
        return link.account
    account = BillingAccount.objects.create(name=project.name, currency=settings.BILLING_CURRENCY)
    ProjectBilling.objects.create(project=project, account=account)
    audit_record(actor=actor, action="billing.account.open", target=account, project=project)
    return account


@transaction.atomic
def project_move_to_account(
    *, actor: User, project: Project, account: BillingAccount
) -> ProjectBilling:
    """Bill a project to another (shared) account from now on. Operators only."""
    if not actor.is_staff:
        raise DomainError(
            "Only operators move projects between billing accounts.", code="staff_only"
        )
    link, _ = ProjectBilling.objects.select_for_update().get_or_create(
        project=project, defaults={"account": account}
    )
    old = link.account_id
    link.account = account
    link.save(update_fields=["account"])
    audit_record(
        actor=actor,
        action="billing.project.move",
        target=link,
        project=project,
        data={"from": old, "to": account.pk},
    )
    return link


# ---- prices and plans --------------------------------------------------------------------


def price_list_seed() -> int:
    """Give every catalog model without a price version one from its catalog price, in effect
    since long ago. Idempotent."""
    priced = set(PriceVersion.objects.values_list("gpu_model_id", flat=True).distinct())
    created = 0
    discount = PriceVersion.default_preemptible_discount()
    for model in GpuModel.objects.exclude(pk__in=priced):
        _, made = PriceVersion.objects.get_or_create(
            gpu_model=model,
            effective_from=PRICE_EPOCH,
            defaults={
                "on_demand_per_gpu_hour": model.price_per_gpu_hour,
                "preemptible_discount": discount,
                "note": "Catalog list price",
            },
        )
        created += made
    return created


@transaction.atomic
def price_publish(
    *,
    actor: User | None,
    gpu_model: GpuModel,
    effective_from: datetime,
    on_demand_per_gpu_hour: Decimal,
    preemptible_discount: Decimal | None = None,
    reserved_discounts: dict[int, Decimal] | None = None,
    note: str = "",
    now: datetime | None = None,
) -> PriceVersion:
    """Add a price version. It must take effect now or later: the past is never repriced."""
    now = now or timezone.now()
    if effective_from < pricing.floor_second(now):
        raise DomainError(
            "A price change cannot take effect in the past; choose a time from now on.",
            field="effective_from",
        )
    if not Decimal(0) <= on_demand_per_gpu_hour < Decimal(100000):
        raise DomainError(
            "A price is 0 to 99,999 USD per GPU-hour.", field="on_demand_per_gpu_hour"
        )
    price_list_seed()
    current = PriceTable.load().at(gpu_model.pk, effective_from)
    version = PriceVersion(
        gpu_model=gpu_model,
        effective_from=effective_from,
        on_demand_per_gpu_hour=on_demand_per_gpu_hour,
        note=note,
        created_by=actor if actor is not None and actor.pk else None,
    )
    discount_fields = (
        "preemptible_discount",
        *(f"reserved_discount_{t}m" for t in pricing.RESERVED_TERMS_MONTHS),
    )
    for name in discount_fields:
        if current is not None:
            setattr(version, name, getattr(current, name))
    if preemptible_discount is not None:
        version.preemptible_discount = preemptible_discount
    for term, value in (reserved_discounts or {}).items():
        setattr(version, f"reserved_discount_{term}m", value)
    for name in discount_fields:
        if not Decimal(0) <= getattr(version, name) <= Decimal(1):
            raise DomainError("A discount is a fraction from 0 to 1.", field=name)
    try:
        with transaction.atomic():
            version.save()
    except IntegrityError:
        raise Conflict(f"{gpu_model.name} already has a price from {effective_from}.") from None
    audit_record(
        actor=actor,
        action="billing.price.publish",
        target=version,
        data={
            "gpu_model": gpu_model.name,
            "effective_from": effective_from.isoformat(),
            "on_demand": str(on_demand_per_gpu_hour),
        },
    )
    return version


@transaction.atomic
def reserved_plan_create(
    *,
    actor: User | None,
    account: BillingAccount,
    gpu_model: GpuModel,
    gpus: int,
    term_months: int,
    starts_at: datetime,
    project: Project | None = None,
) -> ReservedPlan:
    """Reserve `gpus` of a model for a term; the fee comes from the price in effect at start."""
    if term_months not in pricing.RESERVED_TERMS_MONTHS:
        raise DomainError("A reservation term is 1, 12 or 36 months.", field="term_months")
    if not 1 <= gpus <= 4096:
        raise DomainError("Reserve 1 to 4096 GPUs.", field="gpus")
    projects = list(
        ProjectBilling.objects.filter(account=account).values_list("project_id", flat=True)
    )
    if project is None and len(projects) == 1:
        project = Project.objects.get(pk=projects[0])
    if project is None or project.pk not in projects:
        raise DomainError(
            "Name the project (billed to this account) whose jobs the GPUs are guaranteed to.",
            field="project",
        )
    price_list_seed()
    version = PriceTable.load().at(gpu_model.pk, starts_at)
    if version is None:
        raise DomainError(f"{gpu_model.name} has no price at {starts_at}.", field="starts_at")
    plan = ReservedPlan.objects.create(
        account=account,
        project=project,
        gpu_model=gpu_model,
        gpus=gpus,
        term_months=term_months,
        starts_at=starts_at,
        ends_at=pricing.add_months(starts_at, term_months),
        monthly_fee=pricing.reserved_monthly_fee(
            on_demand=version.on_demand_per_gpu_hour,
            gpus=gpus,
            discount=version.reserved_discount(term_months),
        ),
        price_version=version,
    )
    audit_record(
        actor=actor,
        action="billing.reserved.create",
        target=plan,
        project=project,
        data={
            "gpus": gpus,
            "model": gpu_model.name,
            "term": term_months,
            "fee": str(plan.monthly_fee),
        },
    )
    return plan


@transaction.atomic
def credit_grant(
    *,
    actor: User | None,
    account: BillingAccount,
    amount: Decimal,
    description: str = "",
    expires_at: datetime | None = None,
    granted_at: datetime | None = None,
) -> CreditGrant:
    """Prepaid credits for an account; drawn down before anything is charged."""
    if not Decimal("0.01") <= amount < MAX_MONEY:
        raise DomainError("A credit is a positive amount.", field="amount")
    grant = CreditGrant.objects.create(
        account=account,
        amount=amount.quantize(pricing.CENT),
        description=description[:200],
        expires_at=expires_at,
        granted_at=granted_at or timezone.now(),
    )
    audit_record(
        actor=actor, action="billing.credit.grant", target=grant, data={"amount": str(amount)}
    )
    return grant


# ---- metering -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MeterResult:
    allocations: int
    records: int
    credited: int


def usage_meter(
    *,
    now: datetime | None = None,
    allocation_ids: list[int] | None = None,
    project_ids: set[int] | None = None,
    chunk: int = 500,
) -> MeterResult:
    """Meter allocations into usage records, per second, sliced at the allocation end, every
    hour (so every month boundary) and every price change. Running allocations are metered to
    the last whole hour; the open hour is estimated on the fly by readers. Idempotent: slices
    are deterministic and unique per (allocation, slice start)."""
    now = now or timezone.now()
    horizon = pricing.floor_hour(now)
    price_list_seed()
    table = PriceTable.load()
    qs = (
        Allocation.objects.filter(started_at__lt=now)
        .filter(Q(meter__isnull=True) | Q(meter__done=False))
        .select_related("job", "gpu", "meter")
        .order_by("pk")
    )
    if allocation_ids is not None:
        qs = qs.filter(pk__in=allocation_ids)
    if project_ids is not None:
        qs = qs.filter(job__project_id__in=project_ids)
    total = MeterResult(0, 0, 0)
    last_pk = 0
    touched: set[tuple[int, date]] = set()
    while True:
        batch = list(qs.filter(pk__gt=last_pk)[:chunk])
        if not batch:
            break
        last_pk = batch[-1].pk
        result = _meter_batch(batch, table=table, horizon=horizon, now=now, touched=touched)
        total = MeterResult(
            total.allocations + result.allocations,
            total.records + result.records,
            total.credited + result.credited,
        )
    reserved_accounts = set(
        ReservedPlan.objects.filter(account_id__in={a for a, _ in touched}).values_list(
            "account_id", flat=True
        )
    )
    for account_id, period in sorted(touched):
        if account_id in reserved_accounts:
            usage_apply_coverage(account_id=account_id, period_start=period)
    return total


@transaction.atomic
def _meter_batch(
    batch: list[Allocation],
    *,
    table: PriceTable,
    horizon: datetime,
    now: datetime,
    touched: set[tuple[int, date]],
) -> MeterResult:
    accounts = accounts_for_projects({a.job.project_id for a in batch})
    records: list[UsageRecord] = []
    meters: list[AllocationMeter] = []
    faults: list[Allocation] = []
    for alloc in batch:
        start = pricing.floor_second(alloc.started_at)
        existing: AllocationMeter | None = getattr(alloc, "meter", None)
        if alloc.ended_at is not None and alloc.ended_at <= now:
            end, done = max(start, pricing.floor_second(alloc.ended_at)), True
        else:
            end, done = max(start, horizon), False
        begin = max(start, existing.metered_until) if existing is not None else start
        tier = Tier.PREEMPTIBLE if (alloc.job.preemptible or alloc.borrowed) else Tier.ON_DEMAND
        billed = device_share_milli(
            share_milli=alloc.share_milli, capacity_milli=alloc.gpu.capacity_milli
        )
        account_id = accounts[alloc.job.project_id]
        cuts = table.changes_within(alloc.gpu_model_id, begin, end)
        for left, right in pricing.slice_interval(begin, end, cuts):
            version = table.at(alloc.gpu_model_id, left)
            if version is None:  # unreachable after price_list_seed; never bill a guess
                raise DomainError(f"No price for GPU model {alloc.gpu_model_id} at {left}.")
            rate = version.rate(preemptible=tier == Tier.PREEMPTIBLE)
            seconds = int((right - left).total_seconds())
            milli_seconds = seconds * billed
            gross = pricing.usage_amount(milli_seconds, rate)
            period = period_of(left)
            touched.add((account_id, period))
            records.append(
                UsageRecord(
                    allocation_id=alloc.pk,
                    job_id=alloc.job_id,
                    project_id=alloc.job.project_id,
                    account_id=account_id,
                    gpu_model_id=alloc.gpu_model_id,
                    price_version_id=version.pk,
                    period_start=period,
                    slice_start=left,
                    slice_end=right,
                    seconds=seconds,
                    share_milli=alloc.share_milli,
                    billed_milli=billed,
                    milli_seconds=milli_seconds,
                    tier=tier,
                    rate=rate,
                    gross_amount=gross,
                    amount=gross,
                )
            )
        credited = done and pricing.fault_credited(
            end_reason=alloc.end_reason,
            preemptible=tier == Tier.PREEMPTIBLE,
            has_checkpoint=bool(alloc.job.checkpoint_dir),
        )
        if credited and not (existing is not None and existing.fault_credited):
            faults.append(alloc)
        meters.append(
            AllocationMeter(
                allocation_id=alloc.pk,
                metered_until=max(begin, end),
                done=done,
                fault_credited=credited,
            )
        )
    pages = _open_pages({(r.account_id, r.period_start) for r in records})
    for record in records:
        record.invoice_id = pages[(record.account_id, record.period_start)]
    UsageRecord.objects.bulk_create(records, ignore_conflicts=True, batch_size=2000)
    AllocationMeter.objects.bulk_create(
        meters,
        update_conflicts=True,
        unique_fields=["allocation"],
        update_fields=["metered_until", "done", "fault_credited"],
    )
    for alloc in faults:
        _fault_credit(alloc, account_id=accounts[alloc.job.project_id])
    return MeterResult(len(batch), len(records), len(faults))


def _open_pages(pairs: set[tuple[int, date]]) -> dict[tuple[int, date], int]:
    """(account, month) → the draft invoice a new record is written onto: the month's own, or,
    when that month is already closed, the next open month's (the record is then late usage).
    Locks the accounts (FOR NO KEY UPDATE) so that a close, which takes FOR UPDATE, sees either
    none or all of a metering batch."""
    if not pairs:
        return {}
    account_ids = sorted({a for a, _ in pairs})
    list(
        BillingAccount.objects.select_for_update(no_key=True)
        .filter(pk__in=account_ids)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    drafts: dict[tuple[int, date], int] = {}
    last_closed: dict[int, date] = {}
    for account_id, period, status, pk in Invoice.objects.filter(
        account_id__in=account_ids
    ).values_list("account_id", "period_start", "status", "pk"):
        if status == Invoice.Status.DRAFT:
            drafts[(account_id, period)] = pk
        elif period > last_closed.get(account_id, date.min):
            last_closed[account_id] = period
    out: dict[tuple[int, date], int] = {}
    for account_id, period in sorted(pairs):
        target = period
        closed = last_closed.get(account_id)
        if closed is not None and period <= closed:
            target = period_bounds(closed)[1].date()
        if (account_id, target) not in drafts:
            drafts[(account_id, target)] = _draft_invoice(account_id, target).pk
        out[(account_id, period)] = drafts[(account_id, target)]
    return out


def _draft_invoice(account_id: int, period_start: date) -> Invoice:
    """The account's open page for a month, where metering writes records until the close."""
    invoice, _ = Invoice.objects.get_or_create(
        account_id=account_id,
        period_start=period_start,
        defaults={
            "period_end": period_bounds(period_start)[1].date(),
            "number": invoice_number(account_id, period_start),
            "status": Invoice.Status.DRAFT,
        },
    )
    return invoice


def _fault_credit(alloc: Allocation, *, account_id: int) -> None:
    """Apply the fault policy to an allocation's records; those already invoiced get a credit
    adjustment on the next invoice instead."""
    UsageRecord.objects.filter(allocation=alloc, invoice__status=Invoice.Status.DRAFT).update(
        fault_credit=True
    )
    invoiced = UsageRecord.objects.filter(allocation=alloc, fault_credit=False).exclude(
        invoice__status=Invoice.Status.DRAFT
    )
    already = invoiced.aggregate(total=Sum("amount"))["total"] or Decimal(0)
    if already > 0:
        invoiced.update(fault_credit=True)
        Adjustment.objects.create(
            account_id=account_id,
            amount=-pricing.to_cents(already),
            description=f"Platform fault credit, job #{alloc.job_id} ({alloc.get_end_reason_display()}), usage invoiced earlier",
        )
    audit_record(
        actor=None,
        action="billing.usage.fault_credit",
        target=alloc,
        data={"end_reason": alloc.end_reason, "job": alloc.job_id},
    )


@transaction.atomic
def usage_apply_coverage(*, account_id: int, period_start: date) -> int:
    """Recompute which usage of the account's reserved models is covered in an open month.
    Returns how many records changed. A closed month is never touched."""
    if (
        Invoice.objects.filter(account_id=account_id, period_start=period_start)
        .exclude(status=Invoice.Status.DRAFT)
        .exists()
    ):
        return 0
    start, end = period_bounds(period_start)
    plans = list(
        ReservedPlan.objects.filter(account_id=account_id, starts_at__lt=end, ends_at__gt=start)
    )
    epoch = int(start.timestamp())

    def sec(moment: datetime) -> int:
        return int(moment.timestamp()) - epoch

    by_model: dict[int, list[pricing.CapacityStep]] = defaultdict(list)
    for plan in plans:
        by_model[plan.gpu_model_id].append(
            pricing.CapacityStep(
                sec(max(plan.starts_at, start)),
                sec(min(plan.ends_at, end)),
                plan.gpus * pricing.MILLI,
            )
        )
    drafts = UsageRecord.objects.filter(
        account_id=account_id, period_start=period_start, invoice__status=Invoice.Status.DRAFT
    )
    # usage of models without a reservation is never covered (reset it if a plan went away)
    reset = drafts.filter(covered_milli_seconds__gt=0).exclude(gpu_model_id__in=list(by_model))
    changed_count = reset.update(covered_milli_seconds=0, amount=F("gross_amount"))
    if not by_model:
        return changed_count
    records = drafts.filter(gpu_model_id__in=list(by_model)).values_list(
        "pk",
        "gpu_model_id",
        "slice_start",
        "slice_end",
        "billed_milli",
        "milli_seconds",
        "covered_milli_seconds",
        "tier",
        "rate",
    )
    grouped: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in records:
        grouped[row[1]].append(row)
    # most changes share a value (an hour fully covered, or not at all): one UPDATE per value
    changes: dict[tuple[int, Decimal], list[int]] = defaultdict(list)
    for model_id, rows in grouped.items():
        items = [
            pricing.CoverageItem(
                key=pk,
                start=sec(left),
                end=sec(right),
                milli=billed,
                priority=0 if tier == Tier.ON_DEMAND else 1,
            )
            for pk, _, left, right, billed, _, _, tier, _ in rows
        ]
        covered = pricing.allocate_coverage(items, by_model[model_id])
        for pk, _, _, _, _, ms, old, _, rate in rows:
            new = covered.get(pk, 0)
            if new != old:
                changes[(new, pricing.usage_amount(ms - new, rate))].append(pk)
    for (new, amount), pks in changes.items():
        changed_count += UsageRecord.objects.filter(pk__in=pks).update(
            covered_milli_seconds=new, amount=amount
        )
    return changed_count


# ---- notifications and budgets ------------------------------------------------------------


def owner_emails(project_ids: list[int]) -> list[str]:
    return sorted(
        set(
            Membership.objects.filter(project_id__in=project_ids, role=Role.OWNER).values_list(
                "user__email", flat=True
            )
        )
    )


def notification_create(*, project: Project, kind: str, level: str, message: str) -> Notification:
    return Notification.objects.create(
        project=project, kind=kind, level=level, message=message[:500]
    )


def _send_plain(subject: str, body: str, to: list[str]) -> None:
    if not to:
        return
    EmailMultiAlternatives(subject, body, settings.DEFAULT_FROM_EMAIL, to=to).send()


@transaction.atomic
def budget_set(
    *,
    actor: User,
    project: Project,
    monthly_amount: Decimal,
    hard_cap: bool = False,
    preemptible_allowance_percent: int = 10,
) -> Budget:
    """Set a project's monthly budget. Owners only."""
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    if not Decimal("0.01") <= monthly_amount < MAX_MONEY:
        raise DomainError("A budget is a positive amount in USD.", field="monthly_amount")
    if not 0 <= preemptible_allowance_percent <= 100:
        raise DomainError(
            "The preemptible allowance is 0 to 100 % of the budget.",
            field="preemptible_allowance_percent",
        )
    budget, created = Budget.objects.update_or_create(
        project=project,
        defaults={
            "monthly_amount": monthly_amount.quantize(pricing.CENT),
            "hard_cap": hard_cap,
            "preemptible_allowance_percent": preemptible_allowance_percent,
        },
    )
    audit_record(
        actor=actor,
        action="billing.budget.set",
        target=budget,
        project=project,
        data={"amount": str(budget.monthly_amount), "hard_cap": hard_cap, "created": created},
    )
    return budget


@transaction.atomic
def budget_remove(*, actor: User, project: Project) -> None:
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    budget = Budget.objects.filter(project=project).first()
    if budget is None:
        raise NotFound("This project has no budget.")
    audit_record(actor=actor, action="billing.budget.remove", target=budget, project=project)
    budget.delete()


def budgets_check(*, now: datetime | None = None) -> list[BudgetAlert]:
    """Notify owners once per month at 50, 80 and 100 % of each budget."""
    from billing.selectors import project_spend

    now = now or timezone.now()
    period = period_of(now)
    budgets = list(Budget.objects.select_related("project"))
    spend = project_spend(project_ids={b.project_id for b in budgets}, now=now)
    alerts: list[BudgetAlert] = []
    for budget in budgets:
        spent = spend.get(budget.project_id, Decimal(0))
        for threshold in pricing.crossed_thresholds(spent=spent, budget=budget.monthly_amount):
            alert = _budget_alert(budget, period=period, threshold=threshold, spent=spent)
            if alert is not None:
                alerts.append(alert)
    return alerts


@transaction.atomic
def _budget_alert(
    budget: Budget, *, period: date, threshold: int, spent: Decimal
) -> BudgetAlert | None:
    try:
        with transaction.atomic():
            alert = BudgetAlert.objects.create(
                project=budget.project,
                period_start=period,
                threshold=threshold,
                spent=pricing.to_cents(spent),
                budget=budget.monthly_amount,
            )
    except IntegrityError:
        return None  # already notified this month
    project = budget.project
    stop = ""
    if threshold >= 100 and budget.hard_cap:
        stop = " The hard cap now refuses new jobs; preemptible jobs are still accepted."
    message = (
        f"{project.name} has spent ${alert.spent} of its ${budget.monthly_amount} budget "
        f"for {period:%B %Y} ({threshold} %).{stop}"
    )
    level = Notification.Level.ERROR if threshold >= 100 else Notification.Level.WARNING
    notification_create(project=project, kind="budget", level=level, message=message)
    audit_record(
        actor=None,
        action="billing.budget.threshold",
        target=alert,
        project=project,
        data={"threshold": threshold, "spent": str(alert.spent)},
    )
    recipients = owner_emails([project.pk])
    transaction.on_commit(
        lambda: _send_plain(
            f"[{project.name}] {threshold} % of the monthly budget", message, recipients
        )
    )
    return alert


# ---- invoices -------------------------------------------------------------------------------


def invoice_number(account_id: int, period_start: date) -> str:
    return f"GPC-{period_start:%Y%m}-{account_id:06d}"


class _Lines:
    def __init__(self, invoice: Invoice) -> None:
        self.invoice = invoice
        self.rows: list[InvoiceLine] = []

    def add(self, kind: str, description: str, amount: Decimal, **extra: Any) -> InvoiceLine:
        line = InvoiceLine(
            invoice=self.invoice,
            position=len(self.rows) + 1,
            kind=kind,
            description=description[:300],
            amount=amount,
            **extra,
        )
        self.rows.append(line)
        return line

    @property
    def total(self) -> Decimal:
        return pricing.sum_amounts(line.amount for line in self.rows)


@transaction.atomic
def invoice_close(
    *, account_id: int, period_start: date, now: datetime | None = None, meter: bool = True
) -> Invoice:
    """Close a month for one account: meter (unless the caller just metered everything), cover,
    and issue the month's invoice with its lines. Metering writes records onto the month's
    draft invoice; the close prices what is on it and issues it, so no record is ever moved.
    Idempotent: an account's month is issued once (unique per account and month)."""
    now = now or timezone.now()
    start, end = period_bounds(period_start)
    if now < end:
        raise DomainError(f"{period_start:%B %Y} has not ended yet.", field="period")
    # FOR UPDATE waits for metering batches holding the account (FOR NO KEY UPDATE) and keeps
    # new ones out until this month is issued: the draft's records are final while we price.
    account = BillingAccount.objects.select_for_update().get(pk=account_id)
    existing = Invoice.objects.filter(account=account, period_start=period_start).first()
    if existing is not None and existing.status != Invoice.Status.DRAFT:
        return existing
    if meter:
        project_ids = set(
            ProjectBilling.objects.filter(account=account).values_list("project_id", flat=True)
        )
        usage_meter(now=now, project_ids=project_ids)
    usage_apply_coverage(account_id=account.pk, period_start=period_start)
    invoice = _draft_invoice(account.pk, period_start)
    invoice.currency, invoice.tax_rate = account.currency, account.tax_rate
    lines = _Lines(invoice)
    month_seconds = int((end - start).total_seconds())
    for plan in ReservedPlan.objects.filter(
        account=account, starts_at__lt=end, ends_at__gt=start
    ).select_related("gpu_model"):
        part = int((min(plan.ends_at, end) - max(plan.starts_at, start)).total_seconds())
        fee = pricing.prorate(plan.monthly_fee, part_seconds=part, whole_seconds=month_seconds)
        note = (
            ""
            if part == month_seconds
            else f", {part / 86400:.2f} of {month_seconds // 86400} days"
        )
        lines.add(
            InvoiceLine.Kind.RESERVED_FEE,
            f"Reserved {plan.gpus} × {plan.gpu_model.name}, {plan.term_months}-month term{note}",
            fee,
            gpu_model=plan.gpu_model,
            plan=plan,
            unit_price=plan.monthly_fee,
        )
    groups = list(
        UsageRecord.objects.filter(invoice=invoice)
        .values("period_start", "gpu_model_id", "gpu_model__name", "tier", "rate")
        .annotate(
            ms=Sum("milli_seconds"),
            covered=Sum("covered_milli_seconds"),
            cost=Sum("amount"),
            n=Count("id"),
        )
        .order_by("-period_start", "gpu_model__name", "tier", "rate")
    )
    covered: dict[tuple[int, str], list[int]] = {}
    for g in groups:
        if g["covered"] and g["period_start"] == period_start:
            key = (g["gpu_model_id"], g["gpu_model__name"])
            acc = covered.setdefault(key, [0, 0])
            acc[0] += g["covered"]
            acc[1] += g["n"]
    for (model_id, name), (ms, n) in sorted(covered.items(), key=lambda kv: kv[0][1]):
        lines.add(
            InvoiceLine.Kind.COVERED,
            f"{name}: usage covered by reserved capacity",
            Decimal("0.00"),
            gpu_model_id=model_id,
            gpu_hours=pricing.gpu_hours(ms),
            record_count=n,
        )
    for g in groups:
        uncovered = g["ms"] - (g["covered"] or 0)
        if uncovered <= 0:
            continue
        late = g["period_start"] != period_start
        if late:
            kind = InvoiceLine.Kind.LATE_USAGE
            what = f"{g['gpu_model__name']}: {Tier(g['tier']).label.lower()} usage of {g['period_start']:%B %Y} metered after its close"
        elif g["tier"] == Tier.PREEMPTIBLE:
            kind = InvoiceLine.Kind.PREEMPTIBLE
            what = f"{g['gpu_model__name']}: preemptible usage"
        else:
            kind = InvoiceLine.Kind.USAGE
            what = f"{g['gpu_model__name']}: pay-as-you-go usage" + (
                " beyond reserved capacity"
                if (g["gpu_model_id"], g["gpu_model__name"]) in covered
                else ""
            )
        lines.add(
            kind,
            what,
            pricing.to_cents(g["cost"]),
            gpu_model_id=g["gpu_model_id"],
            tier=g["tier"],
            usage_period_start=g["period_start"],
            gpu_hours=pricing.gpu_hours(uncovered),
            unit_price=g["rate"],
            record_count=g["n"],
        )
    for f in (
        UsageRecord.objects.filter(invoice=invoice, fault_credit=True)
        .values("gpu_model_id", "gpu_model__name")
        .annotate(cost=Sum("amount"), ms=Sum("milli_seconds"), n=Count("id"))
        .order_by("gpu_model__name")
    ):
        if f["cost"]:
            lines.add(
                InvoiceLine.Kind.FAULT_CREDIT,
                f"{f['gpu_model__name']}: time lost to platform faults is not billed "
                "(node lost, GPU fault, preemption without checkpoint)",
                -pricing.to_cents(f["cost"]),
                gpu_model_id=f["gpu_model_id"],
                gpu_hours=pricing.gpu_hours(f["ms"]),
                record_count=f["n"],
            )
    adjustments = list(
        Adjustment.objects.select_for_update().filter(account=account, invoice__isnull=True)
    )
    for adj in adjustments:
        lines.add(InvoiceLine.Kind.ADJUSTMENT, adj.description, adj.amount)
    Adjustment.objects.filter(pk__in=[a.pk for a in adjustments]).update(invoice=invoice)
    subtotal = lines.total
    grants = []  # the account row lock above serializes every draw on its grants
    for grant in (
        CreditGrant.objects.filter(account=account, granted_at__lt=end)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=start))
        .annotate(drawn=Sum("applications__amount"))
        .order_by("expires_at", "granted_at", "pk")
    ):
        remaining = grant.amount - (grant.drawn or Decimal(0))
        if remaining > 0:
            grants.append((grant.pk, remaining))
    draws = pricing.apply_credits(grants, subtotal)
    credits = pricing.sum_amounts(d for _, d in draws)
    if credits:
        lines.add(InvoiceLine.Kind.CREDITS, "Prepaid credits drawn down", -credits)
        CreditApplication.objects.bulk_create(
            [CreditApplication(grant_id=g, invoice=invoice, amount=d) for g, d in draws]
        )
    tax = pricing.tax_on(subtotal - credits, account.tax_rate)
    if account.tax_rate > 0:
        lines.add(
            InvoiceLine.Kind.TAX,
            f"Tax at {account.tax_rate * 100:.2f} %",
            tax,
            unit_price=account.tax_rate,
        )
    InvoiceLine.objects.bulk_create(lines.rows)
    invoice.subtotal = subtotal
    invoice.credits_applied = credits
    invoice.tax = tax
    invoice.total = lines.total
    invoice.status = Invoice.Status.OPEN
    invoice.issued_at = now
    invoice.save()
    audit_record(
        actor=None,
        action="billing.invoice.issue",
        target=invoice,
        data={"number": invoice.number, "total": str(invoice.total), "lines": len(lines.rows)},
    )
    invoice_id = invoice.pk
    transaction.on_commit(lambda: enqueue("billing.send_invoice_email", invoice_id))
    if gateway.enabled():
        transaction.on_commit(lambda: enqueue("billing.push_invoice_to_stripe", invoice_id))
    return invoice


def invoice_pdf(*, invoice: Invoice) -> bytes:
    from billing.documents import render_invoice_pdf

    return render_invoice_pdf(invoice)


def invoice_send_email(*, invoice_id: int) -> bool:
    """Email the invoice (text, HTML, PDF attached) to the owners of the account's projects.
    Sent once: a retry after success does nothing."""
    from billing.documents import invoice_context, render_invoice_pdf

    invoice = Invoice.objects.select_related("account").get(pk=invoice_id)
    if invoice.emailed_at is not None or invoice.status == Invoice.Status.DRAFT:
        return False
    project_ids = list(
        ProjectBilling.objects.filter(account=invoice.account).values_list("project_id", flat=True)
    )
    recipients = owner_emails(project_ids)
    if invoice.account.email and invoice.account.email not in recipients:
        recipients.append(invoice.account.email)
    if not recipients:
        return False
    context = invoice_context(invoice)
    message = EmailMultiAlternatives(
        subject=f"Invoice {invoice.number} for {invoice.period_start:%B %Y}: ${invoice.total}",
        body=render_to_string("billing/email/invoice.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=recipients,
    )
    message.attach_alternative(render_to_string("billing/email/invoice.html", context), "text/html")
    message.attach(f"{invoice.number}.pdf", render_invoice_pdf(invoice), "application/pdf")
    message.send()
    with transaction.atomic():
        updated = Invoice.objects.filter(pk=invoice.pk, emailed_at__isnull=True).update(
            emailed_at=timezone.now()
        )
        if updated:
            audit_record(
                actor=None,
                action="billing.invoice.email",
                target=invoice,
                data={"to": recipients},
            )
    return bool(updated)


def previous_period(now: datetime | None = None) -> date:
    """The month before the one holding `now`."""
    now = now or timezone.now()
    return period_of(pricing.month_start(now) - timedelta(days=1))


def invoices_close_month(
    *, period_start: date | None = None, now: datetime | None = None
) -> list[int]:
    """Accounts still to close for a month (default: the month before `now`)."""
    period_start = period_start or previous_period(now)
    usage_meter(now=now)  # opens an account for every project that used GPUs
    done = (
        Invoice.objects.filter(period_start=period_start)
        .exclude(status=Invoice.Status.DRAFT)
        .values_list("account_id", flat=True)
    )
    return list(
        BillingAccount.objects.exclude(pk__in=done).order_by("pk").values_list("pk", flat=True)
    )


# ---- Stripe -----------------------------------------------------------------------------


def _save(obj: Any, **fields: Any) -> None:
    type(obj).objects.filter(pk=obj.pk).update(**fields)
    for name, value in fields.items():
        setattr(obj, name, value)


def invoice_push_to_stripe(*, invoice_id: int) -> str:
    """Copy an issued invoice to Stripe: customer, one item per line, the invoice, finalized.
    Every call carries an idempotency key derived from our ledger ids and every Stripe id is
    saved as soon as it is known, so a retry resumes instead of duplicating."""
    if not gateway.enabled():
        return "stripe disabled"
    invoice = Invoice.objects.select_related("account").get(pk=invoice_id)
    if invoice.status == Invoice.Status.DRAFT:
        raise Conflict("A draft invoice is not sent to Stripe.")
    account = invoice.account
    if not account.stripe_customer_id:
        emails = owner_emails(
            list(
                ProjectBilling.objects.filter(account=account).values_list("project_id", flat=True)
            )
        )
        customer = gateway.customer_create(
            name=account.name,
            email=account.email or (emails[0] if emails else ""),
            ledger_account_id=account.pk,
            idempotency_key=f"gpc-account-{account.pk}-customer",
        )
        _save(account, stripe_customer_id=customer)
    if not invoice.stripe_invoice_id:
        stripe_id = gateway.invoice_create(
            customer_id=account.stripe_customer_id,
            currency=invoice.currency,
            ledger_invoice_id=invoice.pk,
            number=invoice.number,
            idempotency_key=f"gpc-invoice-{invoice.pk}",
        )
        _save(invoice, stripe_invoice_id=stripe_id)
    for line in invoice.lines.order_by("position"):
        cents = int((line.amount * 100).to_integral_value())
        if line.stripe_item_id or cents == 0:
            continue
        item = gateway.invoice_item_create(
            customer_id=account.stripe_customer_id,
            invoice_id=invoice.stripe_invoice_id,
            amount_cents=cents,
            currency=invoice.currency,
            description=line.description,
            ledger_line_id=line.pk,
            idempotency_key=f"gpc-invoice-line-{line.pk}",
        )
        _save(line, stripe_item_id=item)
    if not invoice.stripe_finalized:
        gateway.invoice_finalize(
            invoice_id=invoice.stripe_invoice_id,
            idempotency_key=f"gpc-invoice-{invoice.pk}-finalize",
        )
        _save(invoice, stripe_finalized=True)
        audit_record(
            actor=None,
            action="billing.invoice.stripe_finalize",
            target=invoice,
            data={"stripe_invoice": invoice.stripe_invoice_id},
        )
    return invoice.stripe_invoice_id


PAID_EVENTS = {"invoice.paid", "invoice.payment_succeeded"}
FAILED_EVENTS = {"invoice.payment_failed"}
VOID_EVENTS = {"invoice.voided", "invoice.marked_uncollectible"}


@transaction.atomic
def stripe_event_apply(*, event: dict[str, Any], now: datetime | None = None) -> str:
    """Apply one verified Stripe event. Duplicates (same event id) do nothing; an event older
    than the last one applied to its invoice is recorded and ignored; `paid` is final."""
    now = now or timezone.now()
    event_id, kind = str(event.get("id", "")), str(event.get("type", ""))
    created = int(event.get("created") or 0)
    if not event_id or not kind:
        raise DomainError("The event has no id or type.")
    try:
        with transaction.atomic():
            stored = StripeEvent.objects.create(
                event_id=event_id, type=kind, created=created, payload=event
            )
    except IntegrityError:
        return "duplicate"
    outcome = _apply_invoice_event(kind, event, created, now)
    stored.outcome = outcome[:200]
    stored.save(update_fields=["outcome"])
    return outcome


def _apply_invoice_event(kind: str, event: dict[str, Any], created: int, now: datetime) -> str:
    if not kind.startswith("invoice."):
        return "ignored: not an invoice event"
    obj = (event.get("data") or {}).get("object") or {}
    ledger_id = str((obj.get("metadata") or {}).get("ledger_invoice_id", ""))
    qs = Invoice.objects.select_for_update().select_related("account")
    invoice = None
    if ledger_id.isdigit():
        invoice = qs.filter(pk=int(ledger_id)).first()
    if invoice is None and obj.get("id"):
        invoice = qs.filter(stripe_invoice_id=str(obj["id"])).first()
    if invoice is None:
        return "ignored: unknown invoice"
    if invoice.status == Invoice.Status.PAID:
        return "ignored: already paid"
    if created < invoice.stripe_state_at:
        return "ignored: older than the state applied"
    invoice.stripe_state_at = created
    fields = ["stripe_state_at"]
    outcome = "recorded"
    account = invoice.account
    projects = list(Project.objects.filter(billing__account=account))
    if kind in PAID_EVENTS:
        invoice.status, invoice.paid_at = Invoice.Status.PAID, now
        fields += ["status", "paid_at"]
        outcome = "paid"
    elif kind in FAILED_EVENTS:
        invoice.status, invoice.payment_failed_at = Invoice.Status.PAYMENT_FAILED, now
        fields += ["status", "payment_failed_at"]
        outcome = "payment failed"
    elif kind in VOID_EVENTS:
        invoice.status = Invoice.Status.VOID
        fields += ["status"]
        outcome = "void"
    elif kind == "invoice.finalized":
        invoice.stripe_finalized = True
        fields += ["stripe_finalized"]
        outcome = "finalized"
    invoice.save(update_fields=fields)
    _account_payment_state(account, now=now)
    if outcome == "payment failed":
        grace = settings.BILLING_PAYMENT_GRACE_DAYS
        message = (
            f"Payment of invoice {invoice.number} (${invoice.total}) failed. Update the payment "
            f"method within {grace} days; after that new jobs are stopped until it is paid."
        )
        for project in projects:
            notification_create(
                project=project, kind="payment_failed", level="error", message=message
            )
        recipients = owner_emails([p.pk for p in projects])
        transaction.on_commit(
            lambda: _send_plain(f"Payment failed for invoice {invoice.number}", message, recipients)
        )
    elif outcome == "paid":
        for project in projects:
            notification_create(
                project=project,
                kind="invoice_paid",
                level="info",
                message=f"Invoice {invoice.number} (${invoice.total}) is paid. Thank you.",
            )
    if outcome in {"paid", "payment failed", "void"}:
        audit_record(
            actor=None,
            action=f"billing.invoice.{outcome.replace(' ', '_')}",
            target=invoice,
            data={"event": event.get("id"), "type": kind},
        )
    return outcome


def _account_payment_state(account: BillingAccount, *, now: datetime) -> None:
    """An account is past due from its oldest failed, still unpaid invoice."""
    oldest = (
        Invoice.objects.filter(account=account, status=Invoice.Status.PAYMENT_FAILED)
        .order_by("payment_failed_at")
        .values_list("payment_failed_at", flat=True)
        .first()
    )
    if oldest != account.payment_failed_at:
        BillingAccount.objects.filter(pk=account.pk).update(payment_failed_at=oldest)
        account.payment_failed_at = oldest
