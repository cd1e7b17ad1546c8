"""Project budgets and their alerts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import pricing
from billing.models import (
    Budget,
    BudgetAlert,
    Notification,
)
from billing.pricing import period_of
from billing.selectors import CAP_ACTOR
from billing.services.credits import MAX_MONEY
from billing.services.notifications import notification_create, owner_emails
from portal.audit import audit_record
from portal.errors import DomainError, NotFound
from portal.models import NoticeKind, Project, Role, User
from portal.money import format_money
from portal.notify import notify
from portal.services import require_role


@transaction.atomic
def budget_set(
    *,
    actor: User,
    project: Project,
    monthly_amount: Decimal,
    hard_cap: bool = False,
    preemptible_allowance_percent: int = 10,
    alert_thresholds: list[int] | None = None,
) -> Budget:
    """Set a project's monthly budget and the percentages that notify. Owners only."""
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
            # None keeps the thresholds as they are (a new budget: 50/80/100)
            **(
                {"alert_thresholds": _thresholds_valid(alert_thresholds)}
                if alert_thresholds is not None
                else {}
            ),
        },
    )
    rearmed = [] if created else _rearm_thresholds(budget)
    audit_record(
        actor=actor,
        action="billing.budget.set",
        target=budget,
        project=project,
        data={
            "amount": str(budget.monthly_amount),
            "hard_cap": hard_cap,
            "alert_thresholds": budget.alert_thresholds,
            "created": created,
            "rearmed": rearmed,
        },
    )
    return budget


def _rearm_thresholds(budget: Budget, *, now: datetime | None = None) -> list[int]:
    """A budget raised mid-month re-arms this month's thresholds the spend no longer reaches
    under the new amount: they notify again when the spend gets there. Returns them."""
    from billing.selectors import project_spend

    now = now or timezone.now()
    spent = project_spend(project_ids={budget.project_id}, now=now).get(budget.project_id)
    reached = set(
        pricing.crossed_thresholds(
            spent=spent or Decimal(0),
            budget=budget.monthly_amount,
            thresholds=budget.alert_thresholds,
        )
    )
    alerts = BudgetAlert.objects.filter(project_id=budget.project_id, period_start=period_of(now))
    rearm = sorted(t for t in alerts.values_list("threshold", flat=True) if t not in reached)
    alerts.filter(threshold__in=rearm).delete()
    return rearm


def _thresholds_valid(thresholds: list[int]) -> list[int]:
    try:
        return pricing.parse_budget_thresholds(",".join(str(t) for t in thresholds))
    except ValueError as exc:
        raise DomainError(f"Alert thresholds: {exc}.", field="alert_thresholds") from None


@transaction.atomic
def budget_remove(*, actor: User, project: Project) -> None:
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    budget = Budget.objects.filter(project=project).first()
    if budget is None:
        raise NotFound("This project has no budget.")
    audit_record(actor=actor, action="billing.budget.remove", target=budget, project=project)
    budget.delete()


def budgets_check(*, now: datetime | None = None) -> list[BudgetAlert]:
    """Notify owners once per month per threshold (50, 80, 100 % of each budget). Several
    thresholds crossed at once make one notice, naming the highest; each is recorded, so none
    of them notifies again this month (unless a raised budget re-arms it)."""
    from billing.selectors import project_spend

    now = now or timezone.now()
    period = period_of(now)
    budgets = list(Budget.objects.select_related("project"))
    spend = project_spend(project_ids={b.project_id for b in budgets}, now=now)
    alerts: list[BudgetAlert] = []
    for budget in budgets:
        spent = spend.get(budget.project_id, Decimal(0))
        crossed = pricing.crossed_thresholds(
            spent=spent, budget=budget.monthly_amount, thresholds=budget.alert_thresholds
        )
        if crossed:
            alert = _budget_alert(budget, period=period, thresholds=crossed, spent=spent)
            if alert is not None:
                alerts.append(alert)
    return alerts


@transaction.atomic
def _budget_alert(
    budget: Budget, *, period: date, thresholds: list[int], spent: Decimal
) -> BudgetAlert | None:
    """Record the newly crossed thresholds and send one notice for the highest of them."""
    made: list[BudgetAlert] = []
    for threshold in thresholds:
        try:
            with transaction.atomic():
                made.append(
                    BudgetAlert.objects.create(
                        project=budget.project,
                        period_start=period,
                        threshold=threshold,
                        spent=pricing.to_cents(spent),
                        budget=budget.monthly_amount,
                    )
                )
        except IntegrityError:
            continue  # already notified this month
    if not made:
        return None
    alert = max(made, key=lambda a: a.threshold)
    threshold = alert.threshold
    project = budget.project
    stop = ""
    if threshold >= 100 and budget.hard_cap:
        stop = (
            " The hard cap now refuses new jobs and stops running ones (checkpointed where "
            "they have a checkpoint directory); preemptible jobs may use the allowance."
        )
    message = (
        f"{project.name} has spent {format_money(alert.spent)} of its "
        f"{format_money(budget.monthly_amount)} budget for {period:%B %Y} ({threshold} %).{stop}"
    )
    level = Notification.Level.ERROR if threshold >= 100 else Notification.Level.WARNING
    notification_create(project=project, kind="budget", level=level, message=message)
    audit_record(
        actor=None,
        action="billing.budget.threshold",
        target=alert,
        project=project,
        data={
            "threshold": threshold,
            "crossed": [a.threshold for a in made],
            "spent": str(alert.spent),
        },
    )
    notify(
        kind=NoticeKind.BUDGET_THRESHOLD,
        project=project,
        subject=f"[{project.name}] {threshold} % of the monthly budget",
        message=message,
        to=owner_emails([project.pk]),
        data={"threshold": threshold, "spent": str(alert.spent), "period": period.isoformat()},
    )
    return alert


# ---- the hard cap on running work --------------------------------------------------------

CAP_NOTICE = "budget_cap"


@dataclass(frozen=True)
class CapResult:
    noticed: list[int]
    stopped: list[int]


def budget_caps_enforce(*, now: datetime | None = None) -> CapResult:
    """Hold hard caps on running work (task `billing.enforce_caps`, every
    BILLING_CAP_CHECK_SECONDS). Per hard-capped project, with spend as budgets count it (the
    open hour included) and its burn per hour:

    - spend + burn over the next check reaches the budget: one notice (in-app and email) that
      running jobs will be stopped, once per month and budget amount;
    - spend ≥ the budget: every running non-preemptible job is stopped through preemption
      (its checkpoint directory, if any, is kept; the grace period lets it save), and its
      queued non-preemptible jobs wait (`BUDGET_CAPPED`);
    - spend ≥ the budget + the preemptible allowance: preemptible jobs are stopped too.

    The overshoot is bounded: at most the project's burn over one check interval plus its
    jobs' preemption grace."""
    from billing.selectors import project_burn_per_hour, project_spend

    now = now or timezone.now()
    budgets = list(Budget.objects.filter(hard_cap=True).select_related("project"))
    if not budgets:
        return CapResult([], [])
    spend = project_spend(project_ids={b.project_id for b in budgets}, now=now)
    interval_h = Decimal(str(settings.BILLING_CAP_CHECK_SECONDS)) / 3600
    noticed: list[int] = []
    stopped: list[int] = []
    for budget in budgets:
        spent = spend.get(budget.project_id, Decimal(0))
        ceiling = budget.monthly_amount * (100 + budget.preemptible_allowance_percent) / 100
        if spent >= budget.monthly_amount:
            stopped += _cap_stop(budget, spent=spent, everything=spent >= ceiling, now=now)
            continue
        burn = project_burn_per_hour(project_id=budget.project_id, now=now)
        ahead = burn > 0 and spent + burn * interval_h >= budget.monthly_amount
        if ahead and _cap_notice(budget, spent=spent, burn=burn, now=now):
            noticed.append(budget.project_id)
    return CapResult(noticed, stopped)


@transaction.atomic
def _cap_notice(budget: Budget, *, spent: Decimal, burn: Decimal, now: datetime) -> bool:
    """The notice before the cap stops running work: once per month and budget amount."""
    Budget.objects.select_for_update().filter(pk=budget.pk).first()
    since = max(pricing.month_start(now), budget.updated_at)
    if Notification.objects.filter(
        project_id=budget.project_id, kind=CAP_NOTICE, created_at__gte=since
    ).exists():
        return False
    project = budget.project
    left = max(Decimal(0), budget.monthly_amount - spent)
    minutes = int(left / burn * 60) if burn > 0 else 0
    message = (
        f"{project.name} will reach its {format_money(budget.monthly_amount)} hard cap in "
        f"about {minutes} min at {format_money(burn)}/hour: its running jobs will then be "
        "stopped (checkpointed where they have a checkpoint directory). Raise the budget to "
        "keep them running."
    )
    notification_create(
        project=project, kind=CAP_NOTICE, level=Notification.Level.WARNING, message=message
    )
    audit_record(
        actor=None,
        action="billing.budget.cap_notice",
        target=budget,
        project=project,
        data={"spent": str(pricing.to_cents(spent)), "burn": str(pricing.to_cents(burn))},
    )
    notify(
        kind=NoticeKind.BUDGET_THRESHOLD,
        project=project,
        subject=f"[{project.name}] hard budget cap ahead",
        message=message,
        to=owner_emails([project.pk]),
        data={"cap_ahead_minutes": minutes, "spent": str(pricing.to_cents(spent))},
    )
    return True


def _cap_stop(budget: Budget, *, spent: Decimal, everything: bool, now: datetime) -> list[int]:
    """Preempt the project's running work at its cap (non-preemptible; all past the
    allowance). Each job in its own transaction: one that ended meanwhile is skipped."""
    from scheduler.models import STOPPABLE_STATES, Job, JobState
    from scheduler.transitions import job_transition

    running = Job.objects.filter(
        project_id=budget.project_id,
        state__in=STOPPABLE_STATES,
    )
    if not everything:
        running = running.filter(preemptible=False, borrowed=False)
    stopped: list[int] = []
    reason = (
        f"Budget hard cap: {format_money(pricing.to_cents(spent))} spent of "
        f"{format_money(budget.monthly_amount)}"
        + (" and the preemptible allowance" if everything else "")
        + "; stopped (checkpointed where it has a checkpoint directory)"
    )
    for job_id in list(running.values_list("pk", flat=True)):
        with transaction.atomic():
            job = (
                Job.objects.select_for_update()
                .filter(pk=job_id, state__in=STOPPABLE_STATES)
                .first()
            )
            if job is None:
                continue
            job.preempt_deadline = now + timedelta(seconds=job.grace_seconds)
            job_transition(
                job=job,
                to=JobState.PREEMPTING,
                reason=reason,
                actor_label=CAP_ACTOR,
                data={"budget": str(budget.monthly_amount), "spent": str(pricing.to_cents(spent))},
                update_fields=("preempt_deadline",),
            )
            stopped.append(job.pk)
    if stopped:
        notification_create(
            project=budget.project,
            kind="budget",
            level=Notification.Level.ERROR,
            message=f"{reason}: {len(stopped)} job{'s' if len(stopped) != 1 else ''} "
            f"(#{', #'.join(str(j) for j in stopped)}).",
        )
    return stopped
