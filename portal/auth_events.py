"""Authentication events: audited (who, when, from where) and failed logins locked out.

Every login path (the login page, the admin, anything calling `authenticate`) goes through
`ThrottledModelBackend`, so none bypasses the lockout. Failures are counted per account and
client address: `LOGIN_FAILURE_LIMIT` failures lock that account from that address, and
`LOGIN_ACCOUNT_FAILURE_LIMIT` failures from anywhere lock the account. An address alone is
never locked (a campus behind one NAT must not lock every colleague out); attempts per address
are rate-limited instead (`LOGIN_RATE`, in the URL conf).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest

from portal.audit import audit_record
from portal.models import User

LOCKED_ATTR = "_portal_login_locked"  # set on the request when a locked login was refused


def _keys(email: str, ip: str | None) -> tuple[str, str]:
    """The (account, address) counter and the account counter."""
    account = hashlib.sha256(email.strip().lower().encode()).hexdigest()[:32]
    return f"login-fail:pair:{account}:{ip or '-'}", f"login-fail:account:{account}"


def login_locked(email: str, ip: str | None) -> bool:
    """True while this account is locked from this address, or from everywhere."""
    pair, account = _keys(email, ip)
    counts = cache.get_many([pair, account])
    return (
        counts.get(pair, 0) >= settings.LOGIN_FAILURE_LIMIT
        or counts.get(account, 0) >= settings.LOGIN_ACCOUNT_FAILURE_LIMIT
    )


def lockout_message() -> str:
    minutes = max(1, settings.LOGIN_LOCKOUT_SECONDS // 60)
    return f"Too many failed attempts. Wait {minutes} minutes, then try again."


def _client(request: HttpRequest | None) -> str | None:
    return request.META.get("REMOTE_ADDR") if request is not None else None


def _bump(key: str) -> None:
    cache.add(key, 0, timeout=settings.LOGIN_LOCKOUT_SECONDS)
    try:
        cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, timeout=settings.LOGIN_LOCKOUT_SECONDS)


class ThrottledModelBackend(ModelBackend):
    """Django's password check, refused outright while the account is locked."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        email = username if username is not None else kwargs.get(User.USERNAME_FIELD)
        if email and login_locked(str(email), _client(request)):
            if request is not None:
                setattr(request, LOCKED_ATTR, True)
            raise PermissionDenied(lockout_message())  # stops every backend: no password check
        return super().authenticate(request, username=username, password=password, **kwargs)


@receiver(user_login_failed)
def on_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    email = str(credentials.get("username") or credentials.get("email") or "")
    ip = _client(request)
    locked = request is not None and getattr(request, LOCKED_ATTR, False)
    if not locked:  # a refused attempt while locked does not extend the lock
        for key in _keys(email, ip):
            _bump(key)
    audit_record(
        actor=None,
        action="auth.login_locked" if locked else "auth.login_failed",
        data={"email": email[:254]},
        remote_addr=ip,
    )


@receiver(user_logged_in)
def on_logged_in(sender: Any, request: HttpRequest | None, user: User, **kwargs: Any) -> None:
    ip = _client(request)
    cache.delete(_keys(user.email, ip)[0])
    audit_record(actor=user, action="auth.login", target=user, remote_addr=ip)


@receiver(user_logged_out)
def on_logged_out(
    sender: Any, request: HttpRequest | None, user: User | None, **kwargs: Any
) -> None:
    if user is None:
        return
    audit_record(actor=user, action="auth.logout", target=user, remote_addr=_client(request))
