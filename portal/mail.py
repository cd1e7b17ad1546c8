"""Plain-text e-mail sent once the transaction that decided it commits (never for a rollback)."""

from __future__ import annotations

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction


def send_after_commit(*, subject: str, body: str, to: list[str]) -> None:
    recipients = [a for a in to if a]
    if not recipients:
        return
    message = EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, to=recipients)
    transaction.on_commit(lambda: message.send(fail_silently=False))
