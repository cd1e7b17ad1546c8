"""Celery tasks of monitoring (queue `telemetry`): rollups, fleet snapshots, alerts, retention.

Each takes no arguments, is idempotent, and runs single-flight so overlapping beats are no-ops.
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from foundation.locks import single_flight


@shared_task(
    name="telemetry.flush_rollups", ignore_result=True, time_limit=300, soft_time_limit=280
)  # type: ignore[untyped-decorator]
def flush_rollups() -> int | None:
    from monitoring.rollups import flush_rollups as run

    with single_flight("monitoring-flush", ttl=290) as acquired:
        return run(now=timezone.now()) if acquired else None


@shared_task(name="telemetry.hour_rollups", ignore_result=True, time_limit=300, soft_time_limit=280)  # type: ignore[untyped-decorator]
def hour_rollups() -> int | None:
    from monitoring.rollups import rollup_hours

    with single_flight("monitoring-hours", ttl=290) as acquired:
        return rollup_hours(now=timezone.now()) if acquired else None


@shared_task(name="telemetry.fleet_snapshot", ignore_result=True, time_limit=60, soft_time_limit=50)  # type: ignore[untyped-decorator]
def fleet_snapshot() -> int | None:
    from monitoring.fleet import fleet_snapshot_take

    with single_flight("monitoring-fleet", ttl=55) as acquired:
        return len(fleet_snapshot_take(now=timezone.now())) if acquired else None


@shared_task(
    name="telemetry.evaluate_alerts", ignore_result=True, time_limit=60, soft_time_limit=50
)  # type: ignore[untyped-decorator]
def evaluate_alerts() -> int | None:
    from monitoring.alerts import evaluate_alerts as run

    with single_flight("monitoring-alerts", ttl=55) as acquired:
        return len(run(now=timezone.now()).opened) if acquired else None


@shared_task(
    name="telemetry.enforce_retention", ignore_result=True, time_limit=1800, soft_time_limit=1700
)  # type: ignore[untyped-decorator]
def enforce_retention() -> dict[str, int] | None:
    from monitoring.rollups import enforce_retention as run

    with single_flight("monitoring-retention", ttl=1750) as acquired:
        return run(now=timezone.now()) if acquired else None
