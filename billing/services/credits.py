"""Prepaid credits: grants, and how an invoice draws them down."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import F, Sum
from django.utils import timezone

from billing import pricing
from billing.models import (
    BillingAccount,
    CreditGrant,
    Invoice,
    UsageRecord,
)
from portal.audit import audit_record
from portal.errors import DomainError
from portal.models import User

MAX_MONEY = Decimal("10000000000")
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


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


def credit_draws(
    *,
    account: BillingAccount,
    invoice: Invoice,
    due: Decimal,
    other_charges: Sequence[tuple[datetime, Decimal]] = (),
) -> list[tuple[int, Decimal]]:
    """What each of the account's grants pays on `invoice`: a credit pays only for charges
    inside its validity [granted_at, expires_at). Usage is dated by the start of its slice
    (slices end at every hour, so at most an hour straddles an expiry); `other_charges` are
    the invoice's other dated charges (reserved plan months by their start, adjustments by
    their creation). Soonest-expiring grants draw first; the draws never exceed `due`.
    The caller holds the account's row lock, which serializes every draw on its grants."""
    grants: list[tuple[int, Decimal, datetime, datetime | None]] = []
    for grant in (
        CreditGrant.objects.filter(account=account)
        .annotate(drawn=Sum("applications__amount"))
        .order_by(F("expires_at").asc(nulls_last=True), "granted_at", "pk")
    ):
        remaining = grant.amount - (grant.drawn or Decimal(0))
        if remaining > 0:
            grants.append((grant.pk, remaining, grant.granted_at, grant.expires_at))
    if not grants or due <= 0:
        return []
    edges = sorted({g[2] for g in grants} | {g[3] for g in grants if g[3] is not None})
    records = UsageRecord.objects.filter(invoice=invoice, fault_credit=False)
    charges = [(m, a) for m, a in other_charges if a > 0]
    bounds: list[tuple[datetime | None, datetime | None]] = [
        (None, edges[0]),
        *itertools.pairwise(edges),
        (edges[-1], None),
    ]
    for left, right in bounds:
        part = records
        if left is not None:
            part = part.filter(slice_start__gte=left)
        if right is not None:
            part = part.filter(slice_start__lt=right)
        amount = part.aggregate(total=Sum("amount"))["total"] or Decimal(0)
        if amount > 0:
            charges.append((left or EARLIEST, pricing.to_cents(amount)))
    return pricing.draw_credits(grants, charges, due)
