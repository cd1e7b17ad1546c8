"""Calendar periods, stated once: the hour and the UTC month that quotas, billing and
monitoring's rollups count in. Pure: instants in, instants out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def floor_hour(moment: datetime) -> datetime:
    """The start of the hour holding `moment`."""
    return moment.replace(minute=0, second=0, microsecond=0)


def month_start(moment: datetime) -> datetime:
    """The start of the UTC calendar month holding `moment`."""
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(start: datetime) -> datetime:
    """The start of the month after the one that `start` begins."""
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)
