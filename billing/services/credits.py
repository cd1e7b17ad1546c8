"""Prepaid credits: grants, and how an invoice draws them down."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from billing import pricing
from billing.models import (
    BillingAccount,
    CreditGrant,
)
from portal.audit import audit_record
from portal.errors import DomainError
from portal.models import User

MAX_MONEY = Decimal("10000000000")


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
