"""TOTP second factor (django-otp): set up a device from a QR code or its secret, confirm it
with a code, verify a session with a code; required for operators (portal.middleware). Audited."""

from __future__ import annotations

import base64

import segno
from django.db import transaction
from django.http import HttpRequest
from django_otp import login as otp_login
from django_otp.plugins.otp_totp.models import TOTPDevice

from portal.audit import audit_record
from portal.errors import DomainError, PermissionDenied
from portal.models import User

DEVICE_NAME = "authenticator app"


def confirmed_device(user: User) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user=user, confirmed=True).first()


def pending_device(user: User) -> TOTPDevice:
    """The unconfirmed device being set up (one per user), created on first visit."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).first()
    if device is None:
        device = TOTPDevice.objects.create(user=user, name=DEVICE_NAME, confirmed=False)
    return device


def secret_base32(device: TOTPDevice) -> str:
    return base64.b32encode(device.bin_key).decode()


def qr_data_uri(device: TOTPDevice) -> str:
    """The device's otpauth:// URL as an SVG QR code, inline (no external image, CSP-safe)."""
    return str(segno.make(device.config_url, error="m").svg_data_uri(scale=4))


def _code(token: str) -> str:
    token = "".join((token or "").split())
    if not token.isdigit() or len(token) != 6:
        raise DomainError("Enter the 6-digit code from your app.", field="token")
    return token


@transaction.atomic
def device_confirm(*, request: HttpRequest, user: User, token: str) -> TOTPDevice:
    """Confirm the pending device with a code from the app; the session counts as verified."""
    if confirmed_device(user) is not None:
        raise DomainError("You already have an authenticator; remove it first to replace it.")
    device = TOTPDevice.objects.select_for_update().filter(user=user, confirmed=False).first()
    if device is None or not device.verify_token(_code(token)):
        raise DomainError(
            "That code is not right (or came too late); try the next one.", field="token"
        )
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    otp_login(request, device)
    audit_record(actor=user, action="user.totp.enable", target=user)
    return device


def session_verify(*, request: HttpRequest, user: User, token: str) -> TOTPDevice:
    """Verify this session with a code (throttled per device by django-otp)."""
    device = confirmed_device(user)
    if device is None:
        raise DomainError("You have no authenticator yet; set one up first.")
    allowed, _ = device.verify_is_allowed()
    if not allowed:
        raise DomainError("Too many wrong codes; wait a little, then try again.", field="token")
    if not device.verify_token(_code(token)):
        audit_record(actor=user, action="user.totp.failure", target=user)
        raise DomainError("That code is not right; try the next one.", field="token")
    otp_login(request, device)
    audit_record(actor=user, action="user.totp.verify", target=user)
    return device


@transaction.atomic
def device_remove(*, user: User, token: str) -> None:
    """Remove your authenticator (with a current code). Operators cannot go without one."""
    if user.is_staff:
        raise PermissionDenied("Operators must keep a second factor.")
    device = confirmed_device(user)
    if device is None:
        raise DomainError("You have no authenticator.")
    if not device.verify_token(_code(token)):
        raise DomainError("That code is not right.", field="token")
    TOTPDevice.objects.filter(user=user).delete()
    audit_record(actor=user, action="user.totp.remove", target=user)
