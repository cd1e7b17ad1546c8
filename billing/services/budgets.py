"""Project budgets and their alerts."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import pricing
from billing.models import (
    Budget,
    BudgetAlert,
    Notification,
)
from billing.pricing import period_of
from billing.services.credits import MAX_MONEY
from billing.services.notifications import notification_create, owner_emails, send_plain
from portal.audit import audit_record
from portal.errors import DomainError, NotFound
from portal.models import Project, Role, User
from portal.services import require_role


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
        lambda: send_plain(
            f"[{project.name}] {threshold} % of the monthly budget", message, recipients
        )
    )
    return alert
