"""Billing accounts: opened per project on first use; projects moved between accounts."""

from __future__ import annotations

from django.conf import settings
from django.db import transaction

from billing.models import (
    BillingAccount,
    ProjectBilling,
)
from portal.audit import audit_record
from portal.errors import DomainError
from portal.models import Project, User


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


def account_currency(account: BillingAccount) -> str:
    """The currency an account is invoiced in: the installation's, the one its prices are in.
    An account labelled otherwise (made before the rule, or behind the admin's back) is
    refused by name rather than sent amounts in the wrong currency."""
    if account.currency.lower() != settings.BILLING_CURRENCY:
        raise DomainError(
            f"Billing account {account.name!r} is labelled {account.currency.upper()}, but this "
            f"installation bills in {settings.BILLING_CURRENCY.upper()} only: correct the "
            "account's currency before closing its month.",
            field="currency",
        )
    return settings.BILLING_CURRENCY
