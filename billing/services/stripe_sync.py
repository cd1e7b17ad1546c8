"""Stripe: pushing invoices, and applying its webhook events (idempotent by event id)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import gateway
from billing.models import (
    BillingAccount,
    Invoice,
    ProjectBilling,
    StripeEvent,
)
from billing.services.notifications import notification_create, owner_emails, send_plain
from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import Project
from portal.params import whole_number


def _save(obj: Any, **fields: Any) -> None:
    type(obj).objects.filter(pk=obj.pk).update(**fields)
    for name, value in fields.items():
        setattr(obj, name, value)


def invoice_push_to_stripe(*, invoice_id: int) -> str:
    """Copy an issued invoice to Stripe: customer, one item per line, the invoice, finalized.
    Every call carries an idempotency key derived from our ledger ids and every Stripe id is
    saved as soon as it is known, so a retry resumes instead of duplicating."""
    if not gateway.enabled():
        return "stripe disabled"
    invoice = Invoice.objects.select_related("account").get(pk=invoice_id)
    if invoice.status == Invoice.Status.DRAFT:
        raise Conflict("A draft invoice is not sent to Stripe.")
    account = invoice.account
    if not account.stripe_customer_id:
        emails = owner_emails(
            list(
                ProjectBilling.objects.filter(account=account).values_list("project_id", flat=True)
            )
        )
        customer = gateway.customer_create(
            name=account.name,
            email=account.email or (emails[0] if emails else ""),
            ledger_account_id=account.pk,
            idempotency_key=f"gpc-account-{account.pk}-customer",
        )
        _save(account, stripe_customer_id=customer)
    if not invoice.stripe_invoice_id:
        stripe_id = gateway.invoice_create(
            customer_id=account.stripe_customer_id,
            currency=invoice.currency,
            ledger_invoice_id=invoice.pk,
            number=invoice.number,
            idempotency_key=f"gpc-invoice-{invoice.pk}",
        )
        _save(invoice, stripe_invoice_id=stripe_id)
    for line in invoice.lines.order_by("position"):
        cents = int((line.amount * 100).to_integral_value())
        if line.stripe_item_id or cents == 0:
            continue
        item = gateway.invoice_item_create(
            customer_id=account.stripe_customer_id,
            invoice_id=invoice.stripe_invoice_id,
            amount_cents=cents,
            currency=invoice.currency,
            description=line.description,
            ledger_line_id=line.pk,
            idempotency_key=f"gpc-invoice-line-{line.pk}",
        )
        _save(line, stripe_item_id=item)
    if not invoice.stripe_finalized:
        gateway.invoice_finalize(
            invoice_id=invoice.stripe_invoice_id,
            idempotency_key=f"gpc-invoice-{invoice.pk}-finalize",
        )
        _save(invoice, stripe_finalized=True)
        audit_record(
            actor=None,
            action="billing.invoice.stripe_finalize",
            target=invoice,
            data={"stripe_invoice": invoice.stripe_invoice_id},
        )
    return invoice.stripe_invoice_id


PAID_EVENTS = {"invoice.paid", "invoice.payment_succeeded"}


FAILED_EVENTS = {"invoice.payment_failed"}


VOID_EVENTS = {"invoice.voided", "invoice.marked_uncollectible"}


@transaction.atomic
def stripe_event_apply(*, event: dict[str, Any], now: datetime | None = None) -> str:
    """Apply one verified Stripe event. Duplicates (same event id) do nothing; an event older
    than the last one applied to its invoice is recorded and ignored; `paid` is final."""
    now = now or timezone.now()
    event_id, kind = str(event.get("id", "")), str(event.get("type", ""))
    created = int(event.get("created") or 0)
    if not event_id or not kind:
        raise DomainError("The event has no id or type.")
    try:
        with transaction.atomic():
            stored = StripeEvent.objects.create(
                event_id=event_id, type=kind, created=created, payload=event
            )
    except IntegrityError:
        return "duplicate"
    outcome = _apply_invoice_event(kind, event, created, now)
    stored.outcome = outcome[:200]
    stored.save(update_fields=["outcome"])
    return outcome


def _apply_invoice_event(kind: str, event: dict[str, Any], created: int, now: datetime) -> str:
    if not kind.startswith("invoice."):
        return "ignored: not an invoice event"
    obj = (event.get("data") or {}).get("object") or {}
    ledger_id = str((obj.get("metadata") or {}).get("ledger_invoice_id", ""))
    qs = Invoice.objects.select_for_update().select_related("account")
    invoice = None
    invoice_pk = whole_number(ledger_id, maximum=2**63 - 1)
    if invoice_pk is not None:
        invoice = qs.filter(pk=invoice_pk).first()
    if invoice is None and obj.get("id"):
        invoice = qs.filter(stripe_invoice_id=str(obj["id"])).first()
    if invoice is None:
        return "ignored: unknown invoice"
    if invoice.status == Invoice.Status.PAID:
        return "ignored: already paid"
    if created < invoice.stripe_state_at:
        return "ignored: older than the state applied"
    invoice.stripe_state_at = created
    fields = ["stripe_state_at"]
    outcome = "recorded"
    account = invoice.account
    projects = list(Project.objects.filter(billing__account=account))
    if kind in PAID_EVENTS:
        invoice.status, invoice.paid_at = Invoice.Status.PAID, now
        fields += ["status", "paid_at"]
        outcome = "paid"
    elif kind in FAILED_EVENTS:
        invoice.status, invoice.payment_failed_at = Invoice.Status.PAYMENT_FAILED, now
        fields += ["status", "payment_failed_at"]
        outcome = "payment failed"
    elif kind in VOID_EVENTS:
        invoice.status = Invoice.Status.VOID
        fields += ["status"]
        outcome = "void"
    elif kind == "invoice.finalized":
        invoice.stripe_finalized = True
        fields += ["stripe_finalized"]
        outcome = "finalized"
    invoice.save(update_fields=fields)
    _account_payment_state(account, now=now)
    if outcome == "payment failed":
        grace = settings.BILLING_PAYMENT_GRACE_DAYS
        message = (
            f"Payment of invoice {invoice.number} (${invoice.total}) failed. Update the payment "
            f"method within {grace} days; after that new jobs are stopped until it is paid."
        )
        for project in projects:
            notification_create(
                project=project, kind="payment_failed", level="error", message=message
            )
        recipients = owner_emails([p.pk for p in projects])
        transaction.on_commit(
            lambda: send_plain(f"Payment failed for invoice {invoice.number}", message, recipients)
        )
    elif outcome == "paid":
        for project in projects:
            notification_create(
                project=project,
                kind="invoice_paid",
                level="info",
                message=f"Invoice {invoice.number} (${invoice.total}) is paid. Thank you.",
            )
    if outcome in {"paid", "payment failed", "void"}:
        audit_record(
            actor=None,
            action=f"billing.invoice.{outcome.replace(' ', '_')}",
            target=invoice,
            data={"event": event.get("id"), "type": kind},
        )
    return outcome


def _account_payment_state(account: BillingAccount, *, now: datetime) -> None:
    """An account is past due from its oldest failed, still unpaid invoice."""
    oldest = (
        Invoice.objects.filter(account=account, status=Invoice.Status.PAYMENT_FAILED)
        .order_by("payment_failed_at")
        .values_list("payment_failed_at", flat=True)
        .first()
    )
    if oldest != account.payment_failed_at:
        BillingAccount.objects.filter(pk=account.pk).update(payment_failed_at=oldest)
        account.payment_failed_at = oldest
