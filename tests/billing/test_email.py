"""The invoice email goes through Django's SMTP backend to a real local SMTP server."""

from __future__ import annotations

import socket
from datetime import date
from email import message_from_bytes
from email.policy import default

import pytest
from aiosmtpd.controller import Controller

from billing import services
from billing.models import Invoice
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db


class Inbox:
    def __init__(self) -> None:
        self.envelopes: list = []

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(envelope)
        return "250 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp(settings):
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    yield inbox
    controller.stop()


def test_invoice_email_with_html_text_and_pdf(lab, place, smtp, settings):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 05:00"))
    account = services.account_open_for_project(project=lab["a"])
    invoice = services.invoice_close(
        account_id=account.pk, period_start=date(2025, 3, 1), now=at("2025-04-01 01:00")
    )
    assert services.invoice_send_email(invoice_id=invoice.pk) is True
    assert services.invoice_send_email(invoice_id=invoice.pk) is False  # a retry sends nothing
    assert len(smtp.envelopes) == 1
    envelope = smtp.envelopes[0]
    assert envelope.rcpt_tos == [lab["owner"].email]
    assert settings.DEFAULT_FROM_EMAIL.split("<")[-1].rstrip(">") in envelope.mail_from
    msg = message_from_bytes(envelope.content, policy=default)
    assert invoice.number in msg["Subject"] and str(invoice.total) in msg["Subject"]
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    assert f"Total: ${invoice.total}" in text and "H100-80GB-SXM" in text
    assert "<table" in html and str(invoice.total) in html
    attachments = list(msg.iter_attachments())
    assert [a.get_content_type() for a in attachments] == ["application/pdf"]
    assert attachments[0].get_filename() == f"{invoice.number}.pdf"
    assert attachments[0].get_content().startswith(b"%PDF")
    assert Invoice.objects.get(pk=invoice.pk).emailed_at is not None
