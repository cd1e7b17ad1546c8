"""Storage pages: a project's volumes and datasets (create, delete, upload with progress), its
storage quota and requests for more; the operators' page of every project's storage."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from portal.approvals import decide_from_post
from portal.errors import DomainError, PermissionDenied
from portal.forms import errors_in_words
from portal.htmx import HTMX_STOP_POLLING, render_partial_or_page
from portal.models import Role, User
from portal.selectors import project_get_visible, project_role_of
from storage import datasets, quota_requests, selectors, services
from storage.forms import DecisionForm, StorageQuotaForm, StorageRequestForm, VolumeForm
from storage.models import FillState


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("Operators only.")
        return view(request, *args, **kwargs)

    return wrapper


@login_required
def project_storage(request: HttpRequest, slug: str) -> HttpResponse:
    """The project's volumes, its quota, and (members, owners) the form for a new volume;
    htmx gets the volume list (polled while a dataset fills)."""
    user = _user(request)
    project = project_get_visible(user=user, slug=slug)
    role = project_role_of(user=user, project=project)
    form = VolumeForm()
    status = 200
    if request.method == "POST":
        # A refused volume shows the form again, filled in, with the error on its field.
        form = VolumeForm(request.POST)
        status = 400
        if form.is_valid():
            try:
                volume = services.volume_create(actor=user, project=project, **form.cleaned_data)
                messages.success(request, f"Volume {volume.name} created.")
                return redirect("storage:project-storage", slug=project.slug)
            except PermissionDenied as exc:
                messages.error(request, exc.message)
                return redirect("storage:project-storage", slug=project.slug)
            except DomainError as exc:
                field = exc.field if exc.field in form.fields else None
                form.add_error(field, exc.message)
        messages.error(request, "The volume was not created; the form says why.")
    volumes = list(selectors.volume_list(project=project))
    filling = any(v.fill_state in (FillState.UPLOADING, FillState.IMPORTING) for v in volumes)
    context = {
        "project": project,
        "role": role,
        "can_write": role in (Role.OWNER, Role.MEMBER),
        "is_owner": role == Role.OWNER,
        "volumes": volumes,
        "filling": filling,
        "usage": selectors.storage_usage(project=project),
        "form": form,
        "request_form": StorageRequestForm(),
        "requests": selectors.storage_requests_of(project=project)[:20]
        if role == Role.OWNER or user.is_staff
        else [],
    }
    return render_partial_or_page(
        request,
        page="storage/project_storage.html",
        partial="storage/partials/_volumes.html",
        context=context,
        status=status,
    )


@login_required
def volume_detail(request: HttpRequest, slug: str, volume_id: int) -> HttpResponse:
    """A volume: its facts, a dataset's checksum, and the upload (with progress) while empty;
    htmx polls the progress partial until the dataset is ready or failed."""
    user = _user(request)
    volume = selectors.volume_get_by_id_visible(user=user, project_slug=slug, volume_id=volume_id)
    role = project_role_of(user=user, project=volume.project)
    context = {
        "project": volume.project,
        "volume": volume,
        "progress": datasets.dataset_progress(volume),
        "can_write": role in (Role.OWNER, Role.MEMBER),
    }
    response = render_partial_or_page(
        request,
        page="storage/volume_detail.html",
        partial="storage/partials/_progress.html",
        context=context,
    )
    if request.htmx and volume.fill_state in (FillState.READY, FillState.FAILED):  # type: ignore[attr-defined]
        response.status_code = HTMX_STOP_POLLING
    return response


@login_required
@require_POST
def volume_delete(request: HttpRequest, slug: str, volume_id: int) -> HttpResponse:
    user = _user(request)
    volume = selectors.volume_get_by_id_visible(user=user, project_slug=slug, volume_id=volume_id)
    try:
        services.volume_delete(actor=user, project=volume.project, volume_id=volume.pk)
        messages.success(request, f"Volume {volume.name} deleted.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("storage:project-storage", slug=volume.project.slug)


@login_required
@require_POST
def storage_request_new(request: HttpRequest, slug: str) -> HttpResponse:
    project = project_get_visible(user=_user(request), slug=slug)
    form = StorageRequestForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"The request was not sent: {errors_in_words(form)}")
        return redirect("storage:project-storage", slug=project.slug)
    try:
        quota_requests.storage_request_create(
            actor=_user(request), project=project, **form.cleaned_data
        )
        messages.success(request, "Storage quota request sent to the operators.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("storage:project-storage", slug=project.slug)


@staff_required
def ops_storage(request: HttpRequest) -> HttpResponse:
    """Operators: every project's storage quota and use, and the requests waiting."""
    return render_partial_or_page(
        request,
        page="storage/ops_storage.html",
        partial="storage/partials/_ops_projects.html",
        context={
            "rows": selectors.storage_overview(),
            "pending": selectors.storage_requests_pending(),
            "quota_form": StorageQuotaForm(),
        },
    )


@staff_required
@require_POST
def ops_storage_quota(request: HttpRequest, slug: str) -> HttpResponse:
    project = project_get_visible(user=_user(request), slug=slug)
    form = StorageQuotaForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"The quota was not set: {errors_in_words(form)}")
        return redirect("storage:ops-storage")
    try:
        services.storage_quota_set(
            actor=_user(request), project=project, max_gib=form.cleaned_data["max_gib"]
        )
        messages.success(request, f"{project.slug}: storage quota set.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("storage:ops-storage")


@staff_required
@require_POST
def ops_storage_request_decide(request: HttpRequest, request_id: int) -> HttpResponse:
    return decide_from_post(
        request,
        request_id=request_id,
        form=DecisionForm(request.POST),
        approve=quota_requests.storage_request_approve,
        decline=quota_requests.storage_request_decline,
        approved="Approved: the storage quota changed.",
    )
