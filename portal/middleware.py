"""Request plumbing: the current project for the switcher, and domain errors as 4xx pages."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import logout
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render, resolve_url
from django.urls import reverse
from django_otp.plugins.otp_totp.models import TOTPDevice

from portal.audit import request_remote_addr
from portal.errors import DomainError

SESSION_KEY = "current_project"


class CurrentProjectMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.current_project_slug = (  # type: ignore[attr-defined]
            request.session.get(SESSION_KEY) if hasattr(request, "session") else None
        )
        return self.get_response(request)


class DomainErrorMiddleware:
    """Pages: a DomainError raised by a service becomes a 4xx page with its message."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DomainError):
            return None
        return render(
            request,
            "error.html",
            {"status": exception.status, "message": exception.message},
            status=exception.status,
        )


def has_session_cookie(request: HttpRequest) -> bool:
    """Whether the request names a session. Without one, Django's session is empty and its
    user anonymous, so the session rules below have nothing to do: asking `request.user`
    (loading the user from an empty session, and django-otp's check of it) cost a bearer-token
    API request more than any other middleware (`bench.submit_cost`)."""
    return settings.SESSION_COOKIE_NAME in request.COOKIES


IDLE_KEY = "_last_seen"
IDLE_RENEW_SECONDS = 60  # write the session at most once a minute for activity


class SessionIdleTimeoutMiddleware:
    """Ends a signed-in session unused for SESSION_IDLE_SECONDS.

    What a person does counts as use; what a page does by itself does not: htmx GETs (status
    and chart polls) leave the clock running, so a forgotten tab still times out.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not has_session_cookie(request):  # no session, so no signed-in user to time out
            return self.get_response(request)
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and hasattr(request, "session"):
            now = int(time.time())
            last = request.session.get(IDLE_KEY)
            if isinstance(last, int) and now - last > settings.SESSION_IDLE_SECONDS:
                logout(request)
                if request.headers.get("HX-Request"):
                    response = HttpResponse(status=204)
                    response["HX-Redirect"] = resolve_url(settings.LOGIN_URL)
                    return response
                return redirect_to_login(request.get_full_path())
            automatic = request.method == "GET" and request.headers.get("HX-Request") == "true"
            if not automatic and (not isinstance(last, int) or now - last >= IDLE_RENEW_SECONDS):
                request.session[IDLE_KEY] = now
        return self.get_response(request)


class RequestContextMiddleware:
    """Remembers the client address for audit events written while serving this request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        token = request_remote_addr.set(client_ip(request))
        try:
            return self.get_response(request)
        finally:
            request_remote_addr.reset(token)


def client_ip(request: HttpRequest) -> str | None:
    """REMOTE_ADDR, which `foundation.clientip.ClientAddressMiddleware` has already resolved
    (X-Forwarded-For believed only from TRUSTED_PROXIES)."""
    addr = request.META.get("REMOTE_ADDR") or None
    return addr


CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline'",  # htmx attributes and confirm() handlers
        "style-src 'self' 'unsafe-inline'",  # usage bars set their width inline
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class SecurityHeadersMiddleware:
    """Headers Django 5.2 does not set itself: a content security policy and a permissions
    policy. (HSTS, nosniff, referrer policy and frame options come from Django's settings.)"""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not request.path.startswith("/api/docs"):  # Swagger UI needs inline scripts it builds
            response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault(
            "Permissions-Policy", "camera=(), microphone=(), geolocation=(), payment=()"
        )
        response.headers.setdefault("Cross-Origin-Opener-Policy", "same-origin")
        return response


TWO_FACTOR_OPEN_PATHS = ("/account/two-factor/", "/logout/", "/static/", "/login/")


class StaffTwoFactorMiddleware:
    """Operators (staff) signed in with a session must also have passed a TOTP code
    (django-otp's `is_verified`): one without a confirmed device is sent to set one up, one
    with a device to enter a code, before any other page. API calls with a session get 403.

    Personal API tokens and node tokens are not sessions: DRF authenticates them later, and
    this middleware sees no user for them. `OTP_REQUIRED_FOR_STAFF` turns the rule off."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not has_session_cookie(request):  # a token or nobody: not a session's operator
            return self.get_response(request)
        user = getattr(request, "user", None)
        if (
            settings.OTP_REQUIRED_FOR_STAFF
            and user is not None
            and user.is_authenticated
            and user.is_staff
            and not user.is_verified()  # type: ignore[union-attr]
            and not request.path.startswith(TWO_FACTOR_OPEN_PATHS)
        ):
            if request.path.startswith("/api/"):
                return JsonResponse(
                    {"detail": "Operators must finish two-factor sign-in in the browser first."},
                    status=403,
                )
            has_device = TOTPDevice.objects.filter(user=user, confirmed=True).exists()
            target = reverse("two-factor-verify" if has_device else "two-factor-setup")
            return redirect(f"{target}?{urlencode({'next': request.get_full_path()})}")
        return self.get_response(request)
