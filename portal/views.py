"""Pages of the UI shell: home, project page with members and quotas, API tokens."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from portal import selectors, services
from portal.errors import DomainError
from portal.forms import MemberAddForm, MemberRoleForm, TokenCreateForm
from portal.middleware import SESSION_KEY
from portal.models import Role, User
from scheduler.estimates import model_availability
from scheduler.models import ACTIVE_STATES, JobState
from scheduler.selectors import job_list_visible_to, project_quota_usage, with_landed_model


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The researcher's dashboard: my active jobs, GPU-hours against quota, models available."""
    user = _user(request)
    projects = list(selectors.project_list_visible_to(user=user).select_related("quota"))
    my_jobs = with_landed_model(
        job_list_visible_to(user=user)
        .filter(submitted_by=user, state__in=[*ACTIVE_STATES, JobState.QUEUED])
        .order_by("state", "-created_at")
    )[:20]
    usage = [{"project": p, "rows": project_quota_usage(project=p)[:2]} for p in projects[:8]]
    return render(
        request,
        "portal/home.html",
        {
            "projects": projects,
            "my_jobs": my_jobs,
            "usage": usage,
            "availability": model_availability(),
        },
    )


@login_required
def project_detail(request: HttpRequest, slug: str) -> HttpResponse:
    project = selectors.project_with_quota(user=_user(request), slug=slug)
    request.session[SESSION_KEY] = project.slug
    role = selectors.project_role_of(user=_user(request), project=project)
    context = {
        "project": project,
        "role": role,
        "is_owner": role == Role.OWNER,
        "memberships": selectors.membership_list(project=project),
        "quota_rows": project_quota_usage(project=project),
        "add_form": MemberAddForm(),
        "roles": Role.choices,
    }
    return render(request, "portal/project_detail.html", context)


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
            issued = services.token_create(user=_user(request), name=form.cleaned_data["name"])
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
