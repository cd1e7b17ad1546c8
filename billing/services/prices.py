"""Price lists and reserved plans."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import pricing
from billing.models import (
    BillingAccount,
    PriceVersion,
    ProjectBilling,
    ReservedPlan,
    StoragePrice,
)
from billing.rates import PriceTable
from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import Project, User
from scheduler.models import GpuModel

PRICE_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


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
    """Add a price version. It must take effect now or later: the past is never repriced.
    It takes effect at a whole second (`effective_from` is truncated), as usage is sliced."""
    now = now or timezone.now()
    effective_from = pricing.floor_second(effective_from)
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
def reserved_plan_revise(
    *,
    actor: User | None,
    plan: ReservedPlan,
    gpus: int,
    effective_at: datetime,
    now: datetime | None = None,
) -> ReservedPlan:
    """Change a plan's GPU count from the first of its plan months that begins at or after
    `effective_at` (now or later): the version in force ends there, so each of its plan
    months is billed whole, and a new version, superseding it, holds `gpus` until the old end,
    at the fee of the price in effect then (its own plan months from there)."""
    now = now or timezone.now()
    plan = ReservedPlan.objects.select_for_update().get(pk=plan.pk)
    effective_at = pricing.floor_second(effective_at)
    if effective_at < pricing.floor_second(now):
        raise DomainError("A plan change takes effect now or later.", field="effective_at")
    boundary = next(
        (
            left
            for left, _ in pricing.plan_months(plan.starts_at, plan.ends_at)
            if left >= effective_at
        ),
        None,
    )
    if boundary is None or not plan.starts_at < effective_at:
        raise DomainError(
            "A plan change takes effect while the plan runs; before its start, or to change "
            "its start, make a new plan.",
            field="effective_at",
        )
    if ReservedPlan.objects.filter(supersedes=plan).exists():
        raise Conflict("This plan version was already revised; revise the newest version.")
    if not 1 <= gpus <= 4096:
        raise DomainError("Reserve 1 to 4096 GPUs.", field="gpus")
    effective_at = boundary
    version = PriceTable.load().at(plan.gpu_model_id, effective_at)
    if version is None:
        raise DomainError("No price at that moment.", field="effective_at")
    old_end = plan.ends_at
    ReservedPlan.objects.filter(pk=plan.pk).update(ends_at=effective_at)
    new = ReservedPlan.objects.create(
        account_id=plan.account_id,
        project_id=plan.project_id,
        gpu_model_id=plan.gpu_model_id,
        gpus=gpus,
        term_months=plan.term_months,
        starts_at=effective_at,
        ends_at=old_end,
        monthly_fee=pricing.reserved_monthly_fee(
            on_demand=version.on_demand_per_gpu_hour,
            gpus=gpus,
            discount=version.reserved_discount(plan.term_months),
        ),
        price_version=version,
        supersedes=plan,
    )
    audit_record(
        actor=actor,
        action="billing.reserved.revise",
        target=new,
        project=plan.project,
        data={
            "supersedes": plan.pk,
            "gpus": [plan.gpus, gpus],
            "effective_at": effective_at.isoformat(),
            "fee": str(new.monthly_fee),
        },
    )
    return new


@transaction.atomic
def storage_price_publish(
    *,
    actor: User | None,
    effective_from: datetime,
    per_gib_month: Decimal,
    note: str = "",
    now: datetime | None = None,
) -> StoragePrice:
    """Add a storage price version (per GB-month), as `price_publish` does for GPUs: from now
    on only (metered storage is never repriced), at a whole second, never an edit."""
    now = now or timezone.now()
    effective_from = pricing.floor_second(effective_from)
    if effective_from < pricing.floor_second(now):
        raise DomainError(
            "A price change cannot take effect in the past; choose a time from now on.",
            field="effective_from",
        )
    if not Decimal(0) <= per_gib_month < Decimal(100000):
        raise DomainError("A storage price is 0 to 99,999 USD per GB-month.", field="per_gib_month")
    storage_price_seed()
    try:
        with transaction.atomic():
            version = StoragePrice.objects.create(
                effective_from=effective_from, per_gib_month=per_gib_month, note=note
            )
    except IntegrityError:
        raise Conflict(f"Storage already has a price from {effective_from}.") from None
    audit_record(
        actor=actor,
        action="billing.storage_price.publish",
        target=version,
        data={"effective_from": effective_from.isoformat(), "per_gib_month": str(per_gib_month)},
    )
    return version


def storage_price_seed() -> StoragePrice:
    """The default storage price (settings) in effect since long ago, unless one exists."""
    price = StoragePrice.objects.order_by("effective_from").first()
    if price is not None:
        return price
    price, _ = StoragePrice.objects.get_or_create(
        effective_from=PRICE_EPOCH,
        defaults={
            "per_gib_month": Decimal(str(settings.STORAGE_PRICE_PER_GB_MONTH)),
            "note": "Default storage price",
        },
    )
    return price
