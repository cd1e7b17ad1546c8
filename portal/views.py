"""Tenancy pages: creating a project, invitations and membership changes, sign-up, the account,
password reset, a project's audit log, API tokens (the project page is in `web`)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from foundation.ratelimit import parse_rate, window_hit
from portal import accounts, notify, selectors, services, two_factor
from portal.errors import DomainError, PermissionDenied
from portal.forms import (
    EmailChangeForm,
    MemberAddForm,
    MemberRoleForm,
    ProjectCreateForm,
    SignupForm,
    SignupRequestForm,
    TokenCreateForm,
)
from portal.middleware import client_ip
from portal.models import NoticeKind, ProjectWebhook, Role, TokenScope, User


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


@login_required
def project_new(request: HttpRequest) -> HttpResponse:
    """Create a project; its creator becomes its owner."""
    form = ProjectCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            project = services.project_create(owner=_user(request), **form.cleaned_data)
        except DomainError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            messages.success(request, f"Created {project.name}. You are its owner.")
            return redirect("project-detail", slug=project.slug)
    return render(request, "portal/project_new.html", {"form": form})


def _base_url(request: HttpRequest) -> str:
    return request.build_absolute_uri("/")


@login_required
@require_POST
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    """Invite an address: the answer never says whether it has an account."""
    project = selectors.project_get_visible(user=_user(request), slug=slug)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            accounts.invitation_create(
                actor=_user(request),
                project=project,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
                base_url=_base_url(request),
            )
            messages.success(
                request,
                f"Invitation sent to {form.cleaned_data['email'].lower()}. They join when "
                "they accept it.",
            )
        except DomainError as exc:
            messages.error(request, exc.message)
    else:
        messages.error(request, "Enter a valid email address and role.")
    return redirect("project-detail", slug=project.slug)


@login_required
@require_POST
def invitation_revoke(request: HttpRequest, slug: str, invitation_id: int) -> HttpResponse:
    project = selectors.project_get_visible(user=_user(request), slug=slug)
    try:
        invitation = accounts.invitation_revoke(
            actor=_user(request), project=project, invitation_id=invitation_id
        )
        messages.success(request, f"Revoked the invitation of {invitation.email}.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("project-detail", slug=project.slug)


def invitation_accept(request: HttpRequest, token: str) -> HttpResponse:
    """The link in an invitation: accept it signed in with the invited address, or sign up
    with that address. Anyone else learns nothing and changes nothing."""
    invitation = accounts.invitation_by_token(token=token)
    user = request.user if request.user.is_authenticated else None
    form = SignupForm(request.POST or None) if user is None else None
    error = None
    if request.method == "POST":
        try:
            if user is not None:
                accounts.invitation_accept(user=user, token=token)  # type: ignore[arg-type]
            elif form is not None and form.is_valid():
                user = accounts.invitation_signup(
                    token=token,
                    full_name=form.cleaned_data["full_name"],
                    password=form.cleaned_data["password1"],
                )
                login(request, user, backend="portal.auth_events.ThrottledModelBackend")
            else:
                user = None
        except DomainError as exc:
            if form is not None and exc.field == "password":
                form.add_error("password1", exc.message)
            else:
                error = exc.message
            user = user if request.user.is_authenticated else None
        else:
            if user is not None:
                messages.success(request, f"Welcome to {invitation.project.name}.")
                return redirect("project-detail", slug=invitation.project.slug)
    response = render(
        request,
        "portal/invitation.html",
        {
            "invitation": invitation,
            "form": form,
            "error": error,
            "token": token,
            "wrong_account": user is not None and user.email.lower() != invitation.email,  # type: ignore[union-attr]
        },
        status=400 if error else 200,
    )
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"  # the token is in the URL
    return response


def signup(request: HttpRequest) -> HttpResponse:
    """Open sign-up (only when an operator turned it on): a verification link by e-mail."""
    if not settings.SIGNUP_OPEN:
        raise Http404("Sign-up is by invitation.")
    form = SignupRequestForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if email_rate_exceeded(request, "signup"):
            form.add_error(None, "Too many requests from your address; try again later.")
        else:
            accounts.signup_request(email=form.cleaned_data["email"], base_url=_base_url(request))
            return render(request, "portal/signup_sent.html", {"email": form.cleaned_data["email"]})
    return render(request, "portal/signup.html", {"form": form})


def signup_verify(request: HttpRequest, token: str) -> HttpResponse:
    email = accounts.signup_email_of(token=token)
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = accounts.signup_complete(
                token=token,
                full_name=form.cleaned_data["full_name"],
                password=form.cleaned_data["password1"],
            )
        except DomainError as exc:
            form.add_error("password1" if exc.field == "password" else None, exc.message)
        else:
            login(request, user, backend="portal.auth_events.ThrottledModelBackend")
            messages.success(request, "Your account is ready. Create a project to start.")
            return redirect("project-new")
    response = render(request, "portal/signup_verify.html", {"form": form, "email": email})
    response["Referrer-Policy"] = "no-referrer"
    return response


@login_required
def account(request: HttpRequest) -> HttpResponse:
    """Your account: change the e-mail address (confirmed from the new address)."""
    form = EmailChangeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        if email_rate_exceeded(request, "email-change"):
            form.add_error(None, "Too many requests from your address; try again later.")
        else:
            try:
                accounts.email_change_request(
                    user=_user(request),
                    new_email=form.cleaned_data["new_email"],
                    password=form.cleaned_data["password"],
                    base_url=_base_url(request),
                )
            except DomainError as exc:
                field = {"password": "password", "new_email": "new_email", "email": "new_email"}
                form.add_error(field.get(exc.field or ""), exc.message)
            else:
                messages.success(
                    request,
                    f"We sent a confirmation link to {form.cleaned_data['new_email']}. Your "
                    "address changes when you follow it.",
                )
                return redirect("account")
    return render(
        request,
        "portal/account.html",
        {"form": form, "two_factor_url": reverse("two-factor-setup")},
    )


@login_required
def email_change_confirm(request: HttpRequest, token: str) -> HttpResponse:
    if request.method == "POST":
        try:
            user = accounts.email_change_confirm(user=_user(request), token=token)
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Your address is now {user.email}.")
        return redirect("account")
    response = render(request, "portal/email_change_confirm.html", {"token": token})
    response["Referrer-Policy"] = "no-referrer"
    return response


def email_rate_exceeded(request: HttpRequest, scope: str) -> bool:
    """Requests that send e-mail: `ACCOUNT_EMAIL_RATE` per client address."""
    limit, period = parse_rate(settings.ACCOUNT_EMAIL_RATE)
    count, _ = window_hit(f"account-email:{scope}:{client_ip(request) or '-'}", period)
    return count > limit


class PasswordResetView(auth_views.PasswordResetView):
    """Django's reset, throttled per client address (each valid request sends an e-mail).

    The answer is the same page whether the address has an account or not."""

    def form_valid(self, form: Any) -> HttpResponse:
        if email_rate_exceeded(self.request, "password-reset"):
            form.add_error(None, "Too many requests from your address; try again later.")
            return self.form_invalid(form)
        return super().form_valid(form)


@login_required
def project_audit(request: HttpRequest, slug: str) -> HttpResponse:
    """Who did what, when, in this project: its owners (and operators) only."""
    project = selectors.project_get_visible(user=_user(request), slug=slug)
    role = selectors.project_role_of(user=_user(request), project=project)
    if role != Role.OWNER and not _user(request).is_staff:
        raise PermissionDenied(
            f"Your role in {project.name} is {role}; the audit log is for owners."
        )
    paginator = Paginator(selectors.audit_events_of(project=project), 50)
    page = paginator.get_page(request.GET.get("page"))
    return render(request, "portal/audit.html", {"project": project, "page": page})


@login_required
@require_POST
def member_role(request: HttpRequest, slug: str, membership_id: int) -> HttpResponse:
    project = selectors.project_get_visible(user=_user(request), slug=slug)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose owner, member or viewer.")
        return redirect("project-detail", slug=project.slug)
    try:
        services.membership_change_role(
            actor=_user(request),
            project=project,
            membership_id=membership_id,
            role=form.cleaned_data["role"],
        )
        messages.success(request, "Role changed.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("project-detail", slug=project.slug)


@login_required
@require_POST
def member_remove(request: HttpRequest, slug: str, membership_id: int) -> HttpResponse:
    project = selectors.project_get_visible(user=_user(request), slug=slug)
    try:
        services.membership_remove(
            actor=_user(request), project=project, membership_id=membership_id
        )
        messages.success(request, "Member removed.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("project-detail", slug=project.slug)


@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    form = TokenCreateForm(request.POST or None)
    new_secret = None
    if request.method == "POST" and form.is_valid():
        try:
            issued = services.token_create(
                user=_user(request),
                name=form.cleaned_data["name"],
                scope=form.cleaned_data.get("scope") or TokenScope.FULL,
                expires_in_days=form.cleaned_data.get("expires_in_days"),
            )
            new_secret = issued.secret
            form = TokenCreateForm()
        except DomainError as exc:
            form.add_error("name", exc.message)
    response = render(
        request,
        "portal/tokens.html",
        {
            "tokens": selectors.token_list_of(user=_user(request)),
            "form": form,
            "new_secret": new_secret,
        },
    )
    response["Cache-Control"] = "no-store"  # the new secret must not linger in caches
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    try:
        token = services.token_revoke(user=_user(request), token_id=token_id)
        messages.success(request, f"Revoked {token.name}.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("tokens")


# ---- two-factor sign-in (portal/two_factor.py) -------------------------------------------------


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return reverse("home")


@login_required
def two_factor_setup(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    device = two_factor.confirmed_device(user)
    error = None
    if request.method == "POST":
        try:
            if device is not None:
                two_factor.device_remove(user=user, token=request.POST.get("token", ""))
                messages.success(request, "Authenticator removed.")
                return redirect("two-factor-setup")
            two_factor.device_confirm(
                request=request, user=user, token=request.POST.get("token", "")
            )
            messages.success(request, "Two-factor sign-in is on.")
            return redirect(_safe_next(request))
        except DomainError as exc:
            error = exc.message
    context: dict[str, Any] = {"device": device, "error": error, "next": _safe_next(request)}
    if device is None:
        pending = two_factor.pending_device(user)
        context["qr"] = two_factor.qr_data_uri(pending)
        context["secret"] = two_factor.secret_base32(pending)
    response = render(
        request, "portal/two_factor_setup.html", context, status=400 if error else 200
    )
    response["Cache-Control"] = "no-store"  # the secret must not linger in caches
    return response


@login_required
def two_factor_verify(request: HttpRequest) -> HttpResponse:
    user = _user(request)
    if two_factor.confirmed_device(user) is None:
        return redirect(f"{reverse('two-factor-setup')}?next={quote(_safe_next(request))}")
    error = None
    if request.method == "POST":
        try:
            two_factor.session_verify(
                request=request, user=user, token=request.POST.get("token", "")
            )
            return redirect(_safe_next(request))
        except DomainError as exc:
            error = exc.message
    return render(
        request,
        "portal/two_factor_verify.html",
        {"error": error, "next": _safe_next(request)},
        status=400 if error else 200,
    )


# ---- notices: a user's preferences, a project's webhook (portal/notify.py) ----------------


@login_required
def notification_settings(request: HttpRequest) -> HttpResponse:
    """Which kinds of notice reach the user by e-mail."""
    user = _user(request)
    if request.method == "POST":
        try:
            notify.preferences_set(actor=user, email_kinds=request.POST.getlist("email"))
            messages.success(request, "Notification preferences saved.")
            return redirect("notification-settings")
        except DomainError as exc:
            messages.error(request, exc.message)
    chosen = notify.preferences_of(user)
    kinds = [(kind, label, chosen[kind]) for kind, label in NoticeKind.choices]
    owned = selectors.project_list_visible_to(user=user).filter(
        memberships__user=user, memberships__role=Role.OWNER
    )
    return render(request, "portal/notifications.html", {"kinds": kinds, "owned_projects": owned})


@login_required
def project_webhook(request: HttpRequest, slug: str) -> HttpResponse:
    """The project's webhook (owners): its URL, its secret when new, the latest deliveries."""
    project = selectors.project_get_visible(user=_user(request), slug=slug)
    role = selectors.project_role_of(user=_user(request), project=project)
    if role != Role.OWNER:
        raise PermissionDenied(f"Your role in {project.name} is {role}; webhooks are for owners.")
    new_secret = None
    if request.method == "POST":
        try:
            if request.POST.get("remove"):
                notify.webhook_remove(actor=_user(request), project=project)
                messages.success(request, "Webhook removed.")
                return redirect("project-webhook", slug=project.slug)
            _, new_secret = notify.webhook_set(
                actor=_user(request), project=project, url=request.POST.get("url", "")
            )
            messages.success(request, "Webhook saved.")
            if new_secret is None:
                return redirect("project-webhook", slug=project.slug)
        except DomainError as exc:
            messages.error(request, exc.message)
    webhook = ProjectWebhook.objects.filter(project=project).first()
    deliveries = webhook.deliveries.all()[:20] if webhook else []
    return render(
        request,
        "portal/webhook.html",
        {
            "project": project,
            "webhook": webhook,
            "deliveries": deliveries,
            "new_secret": new_secret,
            "kinds": NoticeKind.choices,
        },
    )
