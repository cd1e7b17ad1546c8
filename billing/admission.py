"""Scheduler ports: budgets and overdue payments at admission and in every cycle.

Policy: at 100 % of a hard-capped budget, new non-preemptible jobs are refused ("budget
exhausted") and the preemptible tier is offered; preemptible work may spend the budget's
preemptible allowance more, after which the scheduler holds every queued job of the project.
An account whose payment failed more than BILLING_PAYMENT_GRACE_DAYS ago stops new jobs too.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from billing import pricing, selectors
from billing.models import Budget, ProjectBilling
from foundation.db import AnyOf, CompiledQuery
from portal.models import Project
from portal.money import format_money
from scheduler.admission import JobSpec, Verdict
from scheduler.core.reasons import format_duration
from scheduler.estimates import billed_gpus
from scheduler.selectors import gpu_models_job_may_use


def expected_cost(spec: JobSpec) -> tuple[Decimal, str]:
    """What admitting `spec` commits under a hard cap, and how it was reckoned: its GPUs as
    billed before placement (`scheduler.estimates.billed_gpus`, the dry run's figure) × the rate of its model
    (the dearest it may land on when it names none) × its time limit, or
    BILLING_CAP_ASSUMED_HOURS when it has none (the cap's enforcement stops it anyway)."""
    candidates = gpu_models_job_may_use(spec)
    rates = selectors.rates_now(gpu_models=candidates, preemptible=spec.preemptible)
    model = max(candidates, key=lambda m: (rates[m.pk], m.name), default=None)
    if model is None:
        return Decimal(0), "no model it may run on"
    rate = rates[model.pk]
    gpus = billed_gpus(spec, model, shards=spec.shard_count)
    if spec.time_limit_s:
        hours = Decimal(spec.time_limit_s) / 3600
        how = f"{format_duration(spec.time_limit_s)} time limit"
    else:
        hours = Decimal(str(settings.BILLING_CAP_ASSUMED_HOURS))
        how = f"no time limit: {hours.normalize()} h assumed"
    cost = pricing.to_cents(rate * gpus * hours)
    return cost, f"{format_money(cost)} expected ({gpus.normalize()} × {model.name}, {how})"


def _preemptible_offer(spec: JobSpec) -> str:
    candidates = gpu_models_job_may_use(spec)
    rates = selectors.rates_now(gpu_models=candidates, preemptible=True)
    model = min(candidates, key=lambda m: (rates[m.pk], m.name), default=None)
    if model is None:
        return "Resubmit it as preemptible"
    rate = rates[model.pk]
    return (
        f"Resubmit it as preemptible ({model.name} at {format_money(rate, places=4)}/GPU-hour "
        "on idle GPUs; it may be stopped)"
    )


class Standing(NamedTuple):
    payment_failed_at: datetime | None
    monthly_amount: Decimal | None
    hard_cap: bool | None
    allowance_percent: int | None


# Fast path (`bench.submit_throughput`, docs/benchmarks.md "Jobs from API submit to running"):
# every submission asks, and building this queryset cost more CPU than answering it.
_STANDING = CompiledQuery(
    lambda project_id: Project.objects.filter(pk=project_id).values_list(
        "billing__account__payment_failed_at",
        "budget__monthly_amount",
        "budget__hard_cap",
        "budget__preemptible_allowance_percent",
    ),
    row=Standing,
)


def budget_check(*, project: Project, spec: JobSpec, now: datetime) -> Verdict | None:
    """Admission check (the scheduler port `ADMISSION_CHECKS`).

    The account's payment standing and the project's budget come in one statement: this runs
    for every submission.
    """
    rows = _STANDING.rows(project_id=project.pk)
    payment_failed_at, monthly_amount, hard_cap, allowance = (
        rows[0] if rows else Standing(None, None, None, None)
    )
    cutoff = now - timedelta(days=settings.BILLING_PAYMENT_GRACE_DAYS)
    if payment_failed_at is not None and payment_failed_at <= cutoff:
        return Verdict(
            False,
            reason=f"Payment overdue: an invoice payment failed on {payment_failed_at:%Y-%m-%d} "
            f"and the {settings.BILLING_PAYMENT_GRACE_DAYS}-day grace period is over. New jobs "
            "start again once it is paid.",
        )
    if monthly_amount is None:
        return None
    spent = pricing.to_cents(selectors.project_spend(project_ids={project.pk}, now=now)[project.pk])
    note = f"budget: {format_money(spent)} of {format_money(monthly_amount)} this month"
    if not hard_cap:
        return Verdict(True, quota_notes=(note,))
    # a hard cap holds: the job's own expected cost counts at admission
    expected, how = expected_cost(spec)
    if spent + expected <= monthly_amount:
        return Verdict(True, quota_notes=(note, how))
    ceiling = monthly_amount * (100 + (allowance or 0)) / 100
    if spec.preemptible and spent + expected <= ceiling:
        return Verdict(True, quota_notes=(note, how, "over budget: admitted as preemptible work"))
    if spec.preemptible:
        return Verdict(
            False,
            reason=f"Budget exhausted: {project.name} has spent {format_money(spent)}, and "
            f"this job's {how} would take it beyond its {format_money(monthly_amount)} "
            "monthly budget and the preemptible allowance. Ask an owner to raise the budget.",
        )
    return Verdict(
        False,
        reason=f"Budget exhausted: {project.name} has spent {format_money(spent)} of its "
        f"{format_money(monthly_amount)} monthly budget (hard cap), and this job's {how} would "
        f"exceed it. {_preemptible_offer(spec)}, set a shorter time limit, or ask an owner "
        "to raise the budget.",
    )


class HardCapRow(NamedTuple):
    project_id: int
    monthly_amount: Decimal
    preemptible_allowance_percent: int


# Fast path (`bench.cycle_cost`: the cycle's fixed cost): every cycle that plans asks both
# ports below, and building these querysets cost more CPU than answering them.
_PAYMENT_OVERDUE = CompiledQuery(
    lambda project_ids, cutoff: ProjectBilling.objects.filter(
        AnyOf(F("project_id"), project_ids), account__payment_failed_at__lte=cutoff
    ).values_list("project_id")
)
_HARD_CAPS = CompiledQuery(
    lambda project_ids: Budget.objects.filter(
        AnyOf(F("project_id"), project_ids), hard_cap=True
    ).values_list("project_id", "monthly_amount", "preemptible_allowance_percent"),
    row=HardCapRow,
)


def projects_over_budget(*, project_ids: set[int]) -> set[int]:
    """The scheduler port `BUDGET_GATE`: projects whose queued jobs must wait."""
    if not project_ids:
        return set()
    now = timezone.now()
    ids = list(project_ids)
    cutoff = now - timedelta(days=settings.BILLING_PAYMENT_GRACE_DAYS)
    out = {project_id for (project_id,) in _PAYMENT_OVERDUE.rows(project_ids=ids, cutoff=cutoff)}
    budgets = _HARD_CAPS.rows(project_ids=ids)
    if budgets:
        spend = selectors.project_spend(project_ids={b.project_id for b in budgets}, now=now)
        for budget in budgets:
            ceiling = budget.monthly_amount * (100 + budget.preemptible_allowance_percent) / 100
            if spend.get(budget.project_id, Decimal(0)) >= ceiling:
                out.add(budget.project_id)
    return out


def projects_at_cap(*, project_ids: set[int]) -> set[int]:
    """The scheduler port `BUDGET_CAPPED`: projects at their hard cap, whose queued
    non-preemptible jobs wait (a job the cap stopped does not start again)."""
    if not project_ids:
        return set()
    budgets = _HARD_CAPS.rows(project_ids=list(project_ids))
    if not budgets:
        return set()
    spend = selectors.project_spend(project_ids={b.project_id for b in budgets})
    return {
        b.project_id for b in budgets if spend.get(b.project_id, Decimal(0)) >= b.monthly_amount
    }
