"""Every Stripe call lives here (a test enforces that no other module imports `stripe`).

Stripe is off when STRIPE_SECRET_KEY is empty; billing then works from the local ledger alone.
Callers pass idempotency keys derived from ledger ids, so a retried call maps to the same
Stripe object. Stripe errors come out as GatewayError, bad signatures as SignatureError.
"""

from __future__ import annotations

import json
from typing import Any

import stripe
from django.conf import settings


class GatewayError(Exception):
    """Stripe refused or could not be reached; the task may retry."""


class SignatureError(Exception):
    """A webhook payload whose signature does not verify."""


def enabled() -> bool:
    return bool(settings.STRIPE_SECRET_KEY)


def _client() -> stripe.StripeClient:
    if not enabled():
        raise GatewayError("Stripe is not configured (STRIPE_SECRET_KEY is empty).")
    base = settings.STRIPE_API_BASE
    return stripe.StripeClient(
        settings.STRIPE_SECRET_KEY,
        base_addresses={"api": base} if base else None,
        max_network_retries=2,
        # The library's default waits 80 s per try; a hung Stripe must not hold a worker.
        http_client=stripe.RequestsClient(timeout=getattr(settings, "STRIPE_TIMEOUT_SECONDS", 20)),
    )


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except stripe.StripeError as exc:
        raise GatewayError(str(exc.user_message or exc)) from exc


def customer_create(*, name: str, email: str, ledger_account_id: int, idempotency_key: str) -> str:
    params: dict[str, Any] = {
        "name": name,
        "metadata": {"ledger_account_id": str(ledger_account_id)},
    }
    if email:
        params["email"] = email
    customer = _call(
        _client().v1.customers.create, params, options={"idempotency_key": idempotency_key}
    )
    return str(customer.id)


def invoice_create(
    *, customer_id: str, currency: str, ledger_invoice_id: int, number: str, idempotency_key: str
) -> str:
    invoice = _call(
        _client().v1.invoices.create,
        {
            "customer": customer_id,
            "currency": currency,
            "collection_method": "charge_automatically",
            "auto_advance": True,
            "pending_invoice_items_behavior": "exclude",
            "number": number,  # our sequence's number, so both documents carry the same
            "metadata": {"ledger_invoice_id": str(ledger_invoice_id), "number": number},
        },
        options={"idempotency_key": idempotency_key},
    )
    return str(invoice.id)


def invoice_item_create(
    *,
    customer_id: str,
    invoice_id: str,
    amount_cents: int,
    currency: str,
    description: str,
    ledger_line_id: int,
    idempotency_key: str,
) -> str:
    item = _call(
        _client().v1.invoice_items.create,
        {
            "customer": customer_id,
            "invoice": invoice_id,
            "amount": amount_cents,
            "currency": currency,
            "description": description,
            "metadata": {"ledger_line_id": str(ledger_line_id)},
        },
        options={"idempotency_key": idempotency_key},
    )
    return str(item.id)


def invoice_finalize(*, invoice_id: str, idempotency_key: str) -> str:
    invoice = _call(
        _client().v1.invoices.finalize_invoice,
        invoice_id,
        options={"idempotency_key": idempotency_key},
    )
    return str(invoice.status)


def event_verify(*, payload: bytes, signature: str) -> dict[str, Any]:
    """The event as a plain dict if its signature verifies with STRIPE_WEBHOOK_SECRET."""
    secret = settings.STRIPE_WEBHOOK_SECRET
    if not secret:
        raise SignatureError("Webhooks are not configured (STRIPE_WEBHOOK_SECRET is empty).")
    try:
        stripe.WebhookSignature.verify_header(
            payload, signature, secret, tolerance=settings.STRIPE_WEBHOOK_TOLERANCE_SECONDS
        )
    except stripe.SignatureVerificationError as exc:
        raise SignatureError(str(exc)) from exc
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise SignatureError("The payload is not JSON.") from exc
    if not isinstance(data, dict):
        raise SignatureError("The payload is not a JSON object.")
    return data
