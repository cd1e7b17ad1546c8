"""Authentication events: audited (who, when, from where) and failed logins throttled."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest

from portal.audit import audit_record
from portal.models import User


def _keys(email: str, ip: str | None) -> tuple[str, str]:
    return f"login-fail:email:{email.strip().lower()}", f"login-fail:ip:{ip or '-'}"


def login_locked(email: str, ip: str | None) -> bool:
    """True while this email, or this client address, has failed too often recently."""
    by_email, by_ip = _keys(email, ip)
    limit = settings.LOGIN_FAILURE_LIMIT
    counts = cache.get_many([by_email, by_ip])
    return counts.get(by_email, 0) >= limit or counts.get(by_ip, 0) >= limit * 4


def _bump(key: str) -> None:
    cache.add(key, 0, timeout=settings.LOGIN_LOCKOUT_SECONDS)
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=settings.LOGIN_LOCKOUT_SECONDS)


@receiver(user_login_failed)
def on_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    email = str(credentials.get("username") or credentials.get("email") or "")
    ip = request.META.get("REMOTE_ADDR") if request is not None else None
    for key in _keys(email, ip):
        _bump(key)
    audit_record(
        actor=None, action="auth.login_failed", data={"email": email[:254]}, remote_addr=ip
    )


@receiver(user_logged_in)
def on_logged_in(sender: Any, request: HttpRequest | None, user: User, **kwargs: Any) -> None:
    ip = request.META.get("REMOTE_ADDR") if request is not None else None
    cache.delete(_keys(user.email, ip)[0])
    audit_record(actor=user, action="auth.login", target=user, remote_addr=ip)


@receiver(user_logged_out)
def on_logged_out(
    sender: Any, request: HttpRequest | None, user: User | None, **kwargs: Any
) -> None:
    if user is None:
        return
    ip = request.META.get("REMOTE_ADDR") if request is not None else None
    audit_record(actor=user, action="auth.logout", target=user, remote_addr=ip)
