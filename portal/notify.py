"""Notices: e-mail to the people concerned (unless they turned that kind off) and the project's
webhook, signed and retried by Celery. Every app tells its news through `notify`; what happened
and who is concerned is the caller's to say.

A webhook receives `POST` with a JSON body `{"id", "kind", "project", "created_at", "data",
"subject", "message"}` and the headers `X-GPUCloud-Event` (the kind), `X-GPUCloud-Delivery`
(the delivery id: the same on every retry) and `X-GPUCloud-Signature: t=<unix time>,v1=<hex>`,
the HMAC-SHA256 with the webhook's secret of `<t>.<body>` (as Stripe signs its events). Any 2xx
answer is a delivery; anything else is retried after WEBHOOK_RETRY_SECONDS, doubling, at most
WEBHOOK_MAX_ATTEMPTS attempts in all.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from foundation.enqueue import enqueue
from portal.audit import audit_record
from portal.errors import DomainError, NotFound
from portal.mail import send_after_commit
from portal.models import (
    NoticeKind,
    NotificationPreference,
    Project,
    ProjectWebhook,
    Role,
    User,
    WebhookDelivery,
)
from portal.services import require_role

SIGNATURE_HEADER = "X-GPUCloud-Signature"


def _emails_off(kinds: Iterable[str], addresses: Iterable[str]) -> set[tuple[str, str]]:
    """(kind, address) pairs among these whose users turned e-mail off: one read."""
    kinds, addresses = sorted(set(kinds)), sorted({a for a in addresses if a})
    if not kinds or not addresses:
        return set()
    return set(
        NotificationPreference.objects.filter(
            kind__in=kinds, email=False, user__email__in=addresses
        ).values_list("kind", "user__email")
    )


@dataclass(frozen=True)
class Notice:
    """One notice for `notify_all`: what `notify` takes."""

    kind: str
    project: Project
    subject: str
    message: str
    to: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)


def notify(
    *,
    kind: str,
    project: Project,
    subject: str,
    message: str,
    to: Iterable[str] = (),
    data: dict[str, Any] | None = None,
) -> WebhookDelivery | None:
    """Tell `to` by e-mail (those who want this kind) and the project's webhook, after the
    commit. Returns the webhook delivery, if the project has an active webhook."""
    notice = Notice(kind, project, subject, message, tuple(to), data or {})
    return notify_all([notice])[0]


def notify_all(notices: Sequence[Notice]) -> list[WebhookDelivery | None]:
    """`notify` for many notices at once (a batch of job moves): one read of who turned
    e-mail off and one of the projects' webhooks, whatever the count; each notice still gets
    its own e-mail and webhook delivery. Returns each notice's delivery, or None."""
    if not notices:
        return []
    off = _emails_off({n.kind for n in notices}, {a for n in notices for a in n.to})
    webhooks = {
        w.project_id: w
        for w in ProjectWebhook.objects.filter(
            project_id__in={n.project.pk for n in notices}, is_active=True
        )
    }
    out: list[WebhookDelivery | None] = []
    for n in notices:
        to = sorted({a for a in n.to if a and (n.kind, a) not in off})
        send_after_commit(subject=n.subject, body=n.message, to=to)
        webhook = webhooks.get(n.project.pk)
        out.append(None if webhook is None else _delivery_record(webhook, n))
    return out


def _delivery_record(webhook: ProjectWebhook, n: Notice) -> WebhookDelivery:
    """The webhook's delivery of one notice, sent by the worker once the transaction commits."""
    delivery = WebhookDelivery.objects.create(webhook=webhook, kind=n.kind, payload={})
    delivery.payload = {
        "id": delivery.pk,
        "kind": n.kind,
        "project": n.project.slug,
        "created_at": delivery.created_at.isoformat(),
        "subject": n.subject,
        "message": n.message,
        "data": n.data,
    }
    delivery.save(update_fields=["payload"])
    transaction.on_commit(lambda: enqueue("portal.webhook_deliver", delivery.pk))
    return delivery


def signature(*, secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def signature_valid(*, secret: str, header: str, body: bytes, tolerance_s: int = 300) -> bool:
    """What a receiver checks (also used by the tests): the MAC, and a recent timestamp."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    expected = signature(secret=secret, timestamp=timestamp, body=body)
    return hmac.compare_digest(expected, header) and abs(time.time() - timestamp) <= tolerance_s


class DeliveryOutcome:
    DELIVERED = "delivered"
    RETRY = "retry"
    GAVE_UP = "gave_up"
    NOTHING = "nothing"  # already delivered or given up (a duplicate task)


def webhook_attempt(*, delivery_id: int) -> str:
    """One attempt to deliver; the task retries on RETRY."""
    delivery = WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != WebhookDelivery.Status.PENDING:
        return DeliveryOutcome.NOTHING
    webhook = delivery.webhook
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "gpucloud-webhooks/1",
        "X-GPUCloud-Event": delivery.kind,
        "X-GPUCloud-Delivery": str(delivery.pk),
        SIGNATURE_HEADER: signature(secret=webhook.secret, timestamp=int(time.time()), body=body),
    }
    code: int | None = None
    error = ""
    try:
        _refuse_private(webhook.url)
        answer = requests.post(
            webhook.url,
            data=body,
            headers=headers,
            timeout=settings.WEBHOOK_TIMEOUT_SECONDS,
            allow_redirects=False,
        )
        code = answer.status_code
        if not 200 <= code < 300:
            error = f"answered {code}"
    except DomainError as exc:
        error = exc.message
    except requests.RequestException as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    delivery.attempts += 1
    delivery.last_status_code = code
    delivery.last_error = error[:500]
    if not error:
        delivery.status = WebhookDelivery.Status.DELIVERED
        delivery.delivered_at = timezone.now()
        outcome = DeliveryOutcome.DELIVERED
    elif delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
        delivery.status = WebhookDelivery.Status.FAILED
        outcome = DeliveryOutcome.GAVE_UP
    else:
        outcome = DeliveryOutcome.RETRY
    delivery.save(
        update_fields=["attempts", "last_status_code", "last_error", "status", "delivered_at"]
    )
    return outcome


def retry_delay(attempts_made: int) -> float:
    return float(settings.WEBHOOK_RETRY_SECONDS * 2 ** max(attempts_made - 1, 0))


def _refuse_private(url: str) -> None:
    """A webhook must not reach the portal's own network (unless the settings allow it)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DomainError("A webhook URL is http:// or https:// with a host.", field="url")
    if settings.WEBHOOK_ALLOW_PRIVATE_HOSTS:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except OSError:
        raise DomainError(f"The host {parts.hostname} does not resolve.", field="url") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            raise DomainError(
                "A webhook URL must point at a public address, not a private or local one.",
                field="url",
            )


# ---- settings: a user's preferences, a project's webhook ---------------------------------


@transaction.atomic
def preferences_set(*, actor: User, email_kinds: Iterable[str]) -> None:
    """E-mail on for `email_kinds`, off for every other kind."""
    wanted = set(email_kinds)
    unknown = wanted - set(NoticeKind.values)
    if unknown:
        raise DomainError(f"Unknown kind of notice: {', '.join(sorted(unknown))}.")
    for kind in NoticeKind.values:
        NotificationPreference.objects.update_or_create(
            user=actor, kind=kind, defaults={"email": kind in wanted}
        )
    audit_record(
        actor=actor,
        action="portal.notifications.preferences",
        target=actor,
        data={"email": sorted(wanted)},
    )


def preferences_of(user: User) -> dict[str, bool]:
    chosen = dict(NotificationPreference.objects.filter(user=user).values_list("kind", "email"))
    return {kind: chosen.get(kind, True) for kind in NoticeKind.values}


@transaction.atomic
def webhook_set(*, actor: User, project: Project, url: str) -> tuple[ProjectWebhook, str | None]:
    """Owners set the project's webhook URL. A new webhook gets a secret, returned once here
    (and shown on the page); changing the URL keeps it."""
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    url = url.strip()
    _refuse_private(url)
    webhook = ProjectWebhook.objects.select_for_update().filter(project=project).first()
    new_secret = None
    if webhook is None:
        new_secret = f"whsec_{secrets.token_urlsafe(32)}"
        webhook = ProjectWebhook.objects.create(project=project, url=url, secret=new_secret)
    else:
        webhook.url, webhook.is_active = url, True
        webhook.save(update_fields=["url", "is_active"])
    audit_record(
        actor=actor,
        action="portal.webhook.set",
        target=webhook,
        project=project,
        data={"url": url, "new_secret": new_secret is not None},
    )
    return webhook, new_secret


@transaction.atomic
def webhook_remove(*, actor: User, project: Project) -> None:
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    webhook = ProjectWebhook.objects.filter(project=project).first()
    if webhook is None:
        raise NotFound("This project has no webhook.")
    audit_record(
        actor=actor,
        action="portal.webhook.remove",
        target=webhook,
        project=project,
        data={"url": webhook.url},
    )
    webhook.delete()
