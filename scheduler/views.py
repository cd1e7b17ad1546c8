"""Pages of the scheduler app: GPU catalog, job form with dry run, job list and detail."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from foundation.params import whole_number
from foundation.ratelimit import scope_allows
from portal.approvals import ask_from_post, decide_from_post
from portal.errors import DomainError
from portal.errors import NotFound as DomainNotFound
from portal.forms import errors_in_words
from portal.htmx import HTMX_STOP_POLLING, render_partial_or_page, wants_partial
from portal.models import Role, User
from portal.selectors import project_get_visible, project_list_visible_to, project_role_of
from scheduler import backends, job_templates, quota_requests, selectors
from scheduler.admission import job_cancel, job_submit
from scheduler.dependencies import array_retry_failed, array_view, is_array_root
from scheduler.elastic import job_resize_request
from scheduler.estimates import job_dry_run, model_availability, with_rates
from scheduler.forms import (
    DecisionForm,
    JobForm,
    OwnerLimitsForm,
    QuotaRequestForm,
    TemplateForm,
)
from scheduler.images import curated_image_list
from scheduler.manifests import job_manifest_yaml
from scheduler.models import PRECISIONS, JobState, LogChunk
from scheduler.ops_views import staff_required
from scheduler.selectors import CatalogFilter, gpu_model_list


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


@login_required
def catalog(request: HttpRequest) -> HttpResponse:
    error = None
    try:
        filters = CatalogFilter.parse(request.GET.dict())
    except DomainError as exc:
        error, filters = exc.message, CatalogFilter()
    context = {
        "gpu_models": with_rates(gpu_model_list(filters=filters)),
        "filters": filters,
        "precisions": PRECISIONS,
        "memory_choices": [16, 24, 40, 48, 80, 141],
        "error": error,
    }
    return render_partial_or_page(
        request,
        page="scheduler/catalog.html",
        partial="scheduler/partials/_catalog_table.html",
        context=context,
        # htmx swaps only 2xx answers, so the partial carries its error with a 200
        status=400 if error and not wants_partial(request) else 200,
    )


def _submittable_projects(user: User):  # type: ignore[no-untyped-def]
    return project_list_visible_to(user=user).filter(
        memberships__user=user, memberships__role__in=[Role.OWNER, Role.MEMBER]
    )


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    projects = _submittable_projects(_user(request))
    initial = {
        "project": request.GET.get("project")
        or getattr(request, "current_project_slug", None)
        or projects.values_list("slug", flat=True).first()
    }
    if request.GET.get("gpu_model"):
        initial["gpu_model"] = request.GET["gpu_model"]
    started_from = _start_from(request, initial)
    form = JobForm(request.POST or None, projects=projects, initial=initial)
    status = 400 if request.method == "POST" else 200
    if request.method == "POST" and form.is_valid() and form.spec is not None:
        # The form spends the same submit budget as the API, one hit per shard.
        allowed, retry_after = scope_allows(
            scope="submit", user_pk=_user(request).pk, hits=form.spec.shard_count
        )
        if not allowed:
            form.add_error(
                None,
                f"You have reached your submit rate limit; try again in {retry_after} s. "
                "Your inputs are kept.",
            )
            status = 429
    if request.method == "POST" and status != 429 and form.is_valid() and form.spec is not None:
        try:
            jobs = job_submit(
                actor=_user(request),
                project=form.cleaned_data["project"],
                spec=form.spec,
                remote_addr=request.META.get("REMOTE_ADDR"),
            )
        except DomainError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            job = jobs[0]
            if job.state == JobState.REJECTED:
                messages.error(request, f"Job rejected: {job.failure_reason}")
            else:
                messages.success(
                    request, f"Submitted {len(jobs)} job{'s' if len(jobs) > 1 else ''}."
                )
            return redirect("job-detail", job_id=job.pk)
    return render(
        request,
        "scheduler/job_form.html",
        {
            "form": form,
            "availability": model_availability(),
            "no_projects": not projects.exists(),
            "curated_images": curated_image_list(),
            "started_from": started_from,
            "templates": job_templates.job_template_list_visible_to(user=_user(request)).filter(
                project__in=projects
            )[:50],
        },
        status=status,
    )


def _start_from(request: HttpRequest, initial: dict[str, object]) -> str:
    """Fill `initial` from ?from=<job id> (clone, edit and resubmit) or ?template=<id>;
    say what the form starts from. An id the user may not see is a 404."""
    user = _user(request)
    job_id = whole_number(request.GET.get("from", ""), maximum=2**63 - 1)
    template_id = whole_number(request.GET.get("template", ""), maximum=2**63 - 1)
    if job_id:
        job = selectors.job_get_visible(user=user, job_id=job_id)
        body = job_templates.job_request_body(job)
        initial.update(job_templates.form_initial(body, project_slug=job.project.slug))
        return f"a copy of job #{job.pk} {job.name}"
    if template_id:
        template = job_templates.job_template_get_visible(user=user, template_id=template_id)
        initial.update(
            job_templates.form_initial(template.body, project_slug=template.project.slug)
        )
        return f"the template '{template.name}'"
    return ""


@login_required
@require_POST
def job_template_save(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.job_get_visible(user=_user(request), job_id=job_id)
    form = TemplateForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"The template was not saved: {errors_in_words(form)}")
        return redirect("job-detail", job_id=job.pk)
    try:
        template = job_templates.job_template_create(
            actor=_user(request),
            job=job,
            name=form.cleaned_data["name"],
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        messages.success(
            request, f"Saved as the template '{template.name}': pick it on the submit page."
        )
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("job-detail", job_id=job.pk)


@login_required
@require_POST
def job_template_delete(request: HttpRequest, template_id: int) -> HttpResponse:
    template = job_templates.job_template_get_visible(user=_user(request), template_id=template_id)
    try:
        job_templates.job_template_delete(
            actor=_user(request), template=template, remote_addr=request.META.get("REMOTE_ADDR")
        )
        messages.success(request, f"Template '{template.name}' deleted.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("job-new")


@login_required
@require_POST
def job_dry_run_view(request: HttpRequest) -> HttpResponse:
    """The dry-run panel beside the form (htmx): cost, estimated start, quota, why it waits."""
    form = JobForm(request.POST, projects=_submittable_projects(_user(request)))
    context: dict[str, object] = {"form": form}
    allowed, retry_after = scope_allows(scope="dry_run", user_pk=_user(request).pk)
    if not allowed:
        context["error"] = f"Too many dry runs; the next is possible in {retry_after} s."
        # htmx swaps only 2xx answers, so the panel carries its error with a 200
        return render(
            request,
            "scheduler/partials/_dry_run.html",
            context,
            status=200 if wants_partial(request) else 429,
        )
    if form.is_valid() and form.spec is not None:
        try:
            context["dry"] = job_dry_run(project=form.cleaned_data["project"], spec=form.spec)
        except DomainError as exc:
            context["error"] = exc.message
    return render(request, "scheduler/partials/_dry_run.html", context)


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    qs = selectors.job_list_visible_to(user=_user(request))
    error = None
    try:
        qs = selectors.job_filter(qs, request.GET.dict())
    except DomainError as exc:
        error = exc.message
    if request.GET.get("mine"):
        qs = qs.filter(submitted_by=_user(request))
    page = Paginator(selectors.with_landed_model(qs), 25).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "jobs": page.object_list,
        "states": JobState.choices,
        "projects": project_list_visible_to(user=_user(request)),
        "params": request.GET,
        "error": error,
    }
    return render_partial_or_page(
        request,
        page="scheduler/job_list.html",
        partial="scheduler/partials/_job_table.html",
        context=context,
        status=400 if error and not wants_partial(request) else 200,
    )


@login_required
def job_logs(request: HttpRequest, job_id: int) -> HttpResponse:
    """Live tail (htmx polls with ?after=<last chunk id> and appends)."""
    job = selectors.job_get_visible(user=_user(request), job_id=job_id)
    after = whole_number(request.GET.get("after", "0"), maximum=2**63 - 1) or 0
    text, last = selectors.job_log_text(job, after_id=after)
    pushed = not backends.is_external(job)
    return render(
        request,
        "scheduler/partials/_log_tail.html",
        {
            "job": job,
            "text": text,
            "last": last,
            "done": job.is_terminal,
            # our agents' appends are pushed (foundation.push); a Slurm job's output file is polled
            "pushed": pushed,
            # more already stored than one answer holds: fetch on at once, else wait for a push
            "more": bool(text)
            and (not pushed or LogChunk.objects.filter(job=job, pk__gt=last).exists()),
        },
    )


@login_required
def job_logs_download(request: HttpRequest, job_id: int) -> StreamingHttpResponse:
    job = selectors.job_get_visible(user=_user(request), job_id=job_id)
    chunks = (
        LogChunk.objects.filter(job=job).order_by("attempt", "pk").values_list("text", flat=True)
    )
    response = StreamingHttpResponse(
        (text for text in chunks.iterator()), content_type="text/plain; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.log"'
    return response


@login_required
def job_manifest_download(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job as a Kubernetes batch/v1 Job manifest (docs/manifests.md)."""
    job = selectors.job_get_visible(user=_user(request), job_id=job_id)
    response = HttpResponse(job_manifest_yaml(job), content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}.yaml"'
    return response


@login_required
@require_POST
def job_cancel_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.job_get_visible(user=_user(request), job_id=job_id)
    try:
        job_cancel(actor=_user(request), job=job, remote_addr=request.META.get("REMOTE_ADDR"))
        messages.success(request, f"Job {job.pk} cancelled; its GPUs are free.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("job-detail", job_id=job.pk)


def _array_root(request: HttpRequest, job_id: int):  # type: ignore[no-untyped-def]
    """The array a visible job belongs to (its first job), or a 404 for a plain job."""
    job = selectors.job_get_visible(user=_user(request), job_id=job_id)
    if job.array_parent_id is not None:
        return job.array_parent
    if not is_array_root(job):
        raise DomainNotFound(f"Job {job.pk} is not part of an array.")
    return job


@login_required
def job_array(request: HttpRequest, job_id: int) -> HttpResponse:
    """One page for an array: shards by state, progress, each shard's log, retry failed."""
    root = _array_root(request, job_id)
    view = array_view(root)
    role = project_role_of(user=_user(request), project=root.project)
    context = {
        "root": root,
        "view": view,
        "can_retry": role in (Role.OWNER, Role.MEMBER) and view.failed > 0,
        "all_ended": view.done == view.total,
    }
    return render_partial_or_page(
        request,
        page="scheduler/job_array.html",
        partial="scheduler/partials/_array_status.html",
        context=context,
        status=HTMX_STOP_POLLING if context["all_ended"] and wants_partial(request) else 200,
    )


@login_required
@require_POST
def job_array_retry(request: HttpRequest, job_id: int) -> HttpResponse:
    root = _array_root(request, job_id)
    try:
        jobs = array_retry_failed(
            actor=_user(request), root=root, remote_addr=request.META.get("REMOTE_ADDR")
        )
        shards = ", ".join(str(j.shard_index) for j in jobs)
        messages.success(request, f"Queued {len(jobs)} failed shard(s) again: {shards}.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("job-array", job_id=root.pk)


@login_required
@require_POST
def job_resize_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.job_get_visible(user=_user(request), job_id=job_id)
    raw = request.POST.get("gpus", "").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= 4096:
        messages.error(request, "Not resized: give the GPUs as a whole number from 1.")
        return redirect("job-detail", job_id=job.pk)
    try:
        job_resize_request(
            actor=_user(request),
            job=job,
            gpus=int(raw),
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        messages.success(
            request,
            f"Job {job.pk} is checkpointing; it restarts on {int(raw)} GPUs with RESUME=1.",
        )
    except DomainError as exc:
        messages.error(request, f"Not resized: {exc.message}")
    return redirect("job-detail", job_id=job.pk)


# ---- quota requests and owners' own limits (scheduler/quota_requests.py) ----------------------


@login_required
@require_POST
def quota_request_new(request: HttpRequest, slug: str) -> HttpResponse:
    return ask_from_post(
        request,
        project=project_get_visible(user=_user(request), slug=slug),
        form=QuotaRequestForm(request.POST),
        create=quota_requests.quota_request_create,
        sent="Quota request sent to the operators.",
    )


@login_required
@require_POST
def project_limits(request: HttpRequest, slug: str) -> HttpResponse:
    project = project_get_visible(user=_user(request), slug=slug)
    form = OwnerLimitsForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Enter a whole number of GPUs, or leave it blank for no cap.")
        return redirect("project-requests", slug=project.slug)
    try:
        quota_requests.quota_owner_limits_set(
            actor=_user(request),
            project=project,
            max_gpus_per_member=form.cleaned_data["max_gpus_per_member"],
        )
        messages.success(request, "Limits saved.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("project-requests", slug=project.slug)


@staff_required
@require_POST
def quota_request_decide(request: HttpRequest, request_id: int) -> HttpResponse:
    return decide_from_post(
        request,
        request_id=request_id,
        form=DecisionForm(request.POST),
        approve=quota_requests.quota_request_approve,
        decline=quota_requests.quota_request_decline,
        approved="Approved: the quota changed.",
    )
