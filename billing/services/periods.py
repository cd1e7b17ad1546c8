"""Month periods: the month before a moment (which month a moment bills to and its bounds are
`billing.pricing`'s; re-exported here for the services)."""

from __future__ import annotations

from datetime import date, datetime, timedelta

from django.utils import timezone

from billing import pricing
from billing.pricing import period_bounds, period_of


def previous_period(now: datetime | None = None) -> date:
    """The month before the one holding `now`."""
    now = now or timezone.now()
    return period_of(pricing.month_start(now) - timedelta(days=1))


__all__ = ["period_bounds", "period_of", "previous_period"]
