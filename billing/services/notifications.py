"""Notifications and emails to project owners (in-app notifications, plain mails, invoice mails)."""

from __future__ import annotations

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import transaction
from django.template.loader import render_to_string
from django.utils import timezone

from billing.models import (
    UNISSUED_STATUSES,
    Invoice,
    Notification,
    ProjectBilling,
)
from portal.audit import audit_record
from portal.models import Membership, Project, Role
from portal.money import format_money


def owner_emails(project_ids: list[int]) -> list[str]:
    return sorted(
        set(
            Membership.objects.filter(project_id__in=project_ids, role=Role.OWNER).values_list(
                "user__email", flat=True
            )
        )
    )


def notification_create(*, project: Project, kind: str, level: str, message: str) -> Notification:
    return Notification.objects.create(
        project=project, kind=kind, level=level, message=message[:500]
    )


def send_plain(subject: str, body: str, to: list[str]) -> None:
    if not to:
        return
    EmailMultiAlternatives(subject, body, settings.DEFAULT_FROM_EMAIL, to=to).send()


@transaction.atomic
def invoice_send_email(*, invoice_id: int) -> bool:
    """Email the invoice (text, HTML, PDF attached) to the owners of the account's projects.
    Sent once: the invoice row is locked while the mail goes out (a concurrent sweep or retry
    skips it) and marked sent in the same transaction; a retry after success does nothing."""
    from billing.documents import invoice_context, render_invoice_pdf

    invoice = (
        Invoice.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("account")
        .filter(pk=invoice_id)
        .first()
    )
    if invoice is None or invoice.emailed_at is not None or invoice.status in UNISSUED_STATUSES:
        return False
    project_ids = list(
        ProjectBilling.objects.filter(account=invoice.account).values_list("project_id", flat=True)
    )
    recipients = owner_emails(project_ids)
    if invoice.account.email and invoice.account.email not in recipients:
        recipients.append(invoice.account.email)
    if not recipients:
        return False
    context = invoice_context(invoice)
    message = EmailMultiAlternatives(
        subject=f"Invoice {invoice.number} for {invoice.period_start:%B %Y}: "
        f"{format_money(invoice.total)}",
        body=render_to_string("billing/email/invoice.txt", context),
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=recipients,
    )
    message.attach_alternative(render_to_string("billing/email/invoice.html", context), "text/html")
    message.attach(f"{invoice.number}.pdf", render_invoice_pdf(invoice), "application/pdf")
    message.send()
    Invoice.objects.filter(pk=invoice.pk).update(emailed_at=timezone.now())
    audit_record(
        actor=None,
        action="billing.invoice.email",
        target=invoice,
        data={"to": recipients},
    )
    return True
