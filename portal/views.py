"""Tenancy pages: membership changes on a project, API tokens (the project page is in `web`)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal import selectors, services
from portal.errors import DomainError
from portal.forms import MemberAddForm, MemberRoleForm, TokenCreateForm
from portal.models import TokenScope, User


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


@login_required
@require_POST
def member_add(request: HttpRequest, slug: str) -> HttpResponse:
    project = selectors.project_get_visible(user=_user(request), slug=slug)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            services.membership_add(
                actor=_user(request),
                project=project,
                email=form.cleaned_data["email"],
                role=form.cleaned_data["role"],
            )
            messages.success(request, f"Added {form.cleaned_data['email']}.")
        except DomainError as exc:
            messages.error(request, exc.message)
    else:
        messages.error(request, "Enter a valid email address and role.")
    return redirect("project-detail", slug=project.slug)


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
