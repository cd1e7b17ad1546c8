"""Celery tasks of the portal: webhook deliveries (portal/notify.py)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from portal.notify import DeliveryOutcome, retry_delay, webhook_attempt


@shared_task(
    name="portal.webhook_deliver",
    bind=True,
    ignore_result=True,
    max_retries=None,  # the delivery row counts the attempts (WEBHOOK_MAX_ATTEMPTS)
    time_limit=60,
    soft_time_limit=50,
)
def webhook_deliver(self: Any, delivery_id: int) -> str:
    outcome = webhook_attempt(delivery_id=delivery_id)
    if outcome == DeliveryOutcome.RETRY:
        attempts = self.request.retries + 1
        raise self.retry(countdown=retry_delay(attempts))
    return outcome
