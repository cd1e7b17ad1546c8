"""Stripe: pushing invoices, and applying its webhook events (idempotent by event id)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing import gateway
from billing.models import (
    UNISSUED_STATUSES,
    BillingAccount,
    Invoice,
    ProjectBilling,
    StripeEvent,
)
from billing.services.notifications import notification_create, owner_emails, send_plain
from foundation.params import whole_number
from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import Project


def invoices_to_resend(*, now: datetime | None = None) -> dict[str, list[int]]:
    """Issued invoices whose e-mail or Stripe push has not gone out (the task after the close
    failed past its retries, or the worker was lost): the sweep re-enqueues them until they
    do. Sending stays once: the mail is marked sent under a row lock, Stripe calls carry
    idempotency keys from ledger ids."""
    now = now or timezone.now()
    since = now - timedelta(days=settings.BILLING_RESEND_DAYS)
    settle = now - timedelta(minutes=10)  # the close's own tasks get their chance first
    issued = Invoice.objects.exclude(status__in=UNISSUED_STATUSES).filter(
        issued_at__gte=since, issued_at__lt=settle
    )
    out = {
        "email": list(issued.filter(emailed_at__isnull=True).values_list("pk", flat=True)),
        "stripe": [],
    }
    if gateway.enabled():
        out["stripe"] = list(
            issued.filter(
                stripe_finalized=False,
                total__gt=0,
                status__in=[Invoice.Status.OPEN, Invoice.Status.PAYMENT_FAILED],
            ).values_list("pk", flat=True)
        )
    return out


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
    if invoice.status in UNISSUED_STATUSES:
        raise Conflict("A draft invoice is not sent to Stripe.")
    if invoice.total <= 0:
        return "nothing to collect"
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


VOID_EVENTS = {"invoice.voided"}


UNCOLLECTIBLE_EVENTS = {"invoice.marked_uncollectible"}


# Events are ordered by what they mean, not by when they arrive nor by their `created`: an
# invoice only moves forward through finalized → payment failed → uncollectible → paid or
# void, so a late `payment_failed` still counts after a newer `finalized`, and nothing
# undoes paid or void. Same rank: applied again (harmless).
EVENT_RANK: dict[str, int] = {
    "invoice.finalized": 1,
    **dict.fromkeys(FAILED_EVENTS, 2),
    **dict.fromkeys(UNCOLLECTIBLE_EVENTS, 3),
    **dict.fromkeys(PAID_EVENTS, 4),
    **dict.fromkeys(VOID_EVENTS, 4),
}
STATUS_RANK: dict[str, int] = {
    Invoice.Status.OPEN: 0,
    Invoice.Status.PAYMENT_FAILED: 2,
    Invoice.Status.UNCOLLECTIBLE: 3,
    Invoice.Status.PAID: 4,
    Invoice.Status.VOID: 4,
}
FINAL_STATUSES = {Invoice.Status.PAID, Invoice.Status.VOID}


@transaction.atomic
def stripe_event_apply(*, event: dict[str, Any], now: datetime | None = None) -> str:
    """Apply one verified Stripe event. Duplicates (same event id) do nothing; events are
    ordered by meaning (`EVENT_RANK`): one that would move the invoice back is recorded and
    ignored; paid and void are final; paid only when the whole amount came in its currency."""
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


def _amount_short(invoice: Invoice, obj: dict[str, Any]) -> str:
    """Why a `paid` event does not settle the invoice ('' when it does): Stripe's
    `amount_paid` (cents) must cover our total in our currency."""
    currency = str(obj.get("currency") or "").lower()
    paid = whole_number(str(obj.get("amount_paid", "")), maximum=2**63 - 1)
    due = int((invoice.total * 100).to_integral_value())
    if currency != invoice.currency.lower():
        return f"paid in {currency or 'no currency'}, invoice is in {invoice.currency}"
    if paid is None or paid < due:
        got = "nothing" if paid is None else f"{Decimal(paid) / 100:.2f}"
        return f"paid {got} of {invoice.total} {invoice.currency}"
    return ""


def _apply_invoice_event(kind: str, event: dict[str, Any], created: int, now: datetime) -> str:
    """One invoice event, in named steps: find its invoice, see whether it moves it on, set the
    new status, then the account's standing, the projects told and the audit event."""
    if not kind.startswith("invoice."):
        return "ignored: not an invoice event"
    obj = (event.get("data") or {}).get("object") or {}
    invoice = _event_invoice(obj)
    if invoice is None:
        return "ignored: unknown invoice"
    ignored = _ignored_because(kind, invoice)
    if ignored:
        return ignored
    fields = ["stripe_state_at"]
    invoice.stripe_state_at = max(invoice.stripe_state_at, created)
    account = invoice.account
    projects = list(Project.objects.filter(billing__account=account))
    short = _amount_short(invoice, obj) if kind in PAID_EVENTS else ""
    if short:
        invoice.save(update_fields=fields)
        audit_record(
            actor=None,
            action="billing.invoice.payment_short",
            target=invoice,
            data={"event": event.get("id"), "type": kind, "why": short},
        )
        return f"not paid: {short}"
    outcome = _invoice_status_set(invoice, kind, fields, now=now)
    invoice.save(update_fields=fields)
    _account_payment_state(account, now=now)
    _projects_told(invoice, outcome, projects)
    if outcome != "recorded":
        audit_record(
            actor=None,
            action=f"billing.invoice.{outcome.replace(' ', '_')}",
            target=invoice,
            data={"event": event.get("id"), "type": kind},
        )
    return outcome


def _event_invoice(obj: dict[str, Any]) -> Invoice | None:
    """The event's invoice, locked: by our ledger id in its metadata, else by Stripe's id."""
    ledger_id = str((obj.get("metadata") or {}).get("ledger_invoice_id", ""))
    qs = Invoice.objects.select_for_update().select_related("account")
    invoice = None
    invoice_pk = whole_number(ledger_id, maximum=2**63 - 1)
    if invoice_pk is not None:
        invoice = qs.filter(pk=invoice_pk).first()
    if invoice is None and obj.get("id"):
        invoice = qs.filter(stripe_invoice_id=str(obj["id"])).first()
    return invoice


def _ignored_because(kind: str, invoice: Invoice) -> str:
    """Why the event leaves the invoice as it is ("" when it moves it on)."""
    if invoice.status in FINAL_STATUSES:
        return f"ignored: already {invoice.status}"
    rank = EVENT_RANK.get(kind)
    if rank is None:
        return "ignored: not a state change"
    if rank < STATUS_RANK.get(invoice.status, 0):
        return f"ignored: the invoice is already {invoice.get_status_display().lower()}"
    return ""


def _invoice_status_set(invoice: Invoice, kind: str, fields: list[str], *, now: datetime) -> str:
    """The invoice's new status for the event (its fields added to `fields`); the outcome."""
    if kind in PAID_EVENTS:
        invoice.status, invoice.paid_at = Invoice.Status.PAID, now
        fields += ["status", "paid_at"]
        return "paid"
    if kind in FAILED_EVENTS:
        invoice.status = Invoice.Status.PAYMENT_FAILED
        invoice.payment_failed_at = invoice.payment_failed_at or now
        fields += ["status", "payment_failed_at"]
        return "payment failed"
    if kind in UNCOLLECTIBLE_EVENTS:
        # Not void: the money is still owed and the account stays blocked as a failed one.
        invoice.status = Invoice.Status.UNCOLLECTIBLE
        invoice.payment_failed_at = invoice.payment_failed_at or now
        fields += ["status", "payment_failed_at"]
        return "uncollectible"
    if kind in VOID_EVENTS:
        invoice.status = Invoice.Status.VOID
        fields += ["status"]
        return "void"
    invoice.stripe_finalized = True  # invoice.finalized
    fields += ["stripe_finalized"]
    return "finalized"


def _projects_told(invoice: Invoice, outcome: str, projects: list[Project]) -> None:
    """A failed payment: a notification and an email to the owners; a payment: a notification."""
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


BLOCKING_STATUSES = (Invoice.Status.PAYMENT_FAILED, Invoice.Status.UNCOLLECTIBLE)


def _account_payment_state(account: BillingAccount, *, now: datetime) -> None:
    """An account is past due from its oldest failed (or uncollectible), still unpaid
    invoice."""
    oldest = (
        Invoice.objects.filter(account=account, status__in=BLOCKING_STATUSES)
        .order_by("payment_failed_at")
        .values_list("payment_failed_at", flat=True)
        .first()
    )
    if oldest != account.payment_failed_at:
        BillingAccount.objects.filter(pk=account.pk).update(payment_failed_at=oldest)
        account.payment_failed_at = oldest
