"""The composite pages of the top layer: each shows what several apps know about one thing.

The dashboard (jobs, quota use, models available), the project page (members and its quotas), the
job page (its status, monitoring's charts, its cost) and an operator's node page (its GPUs and
monitoring's charts). Domain apps' templates never include one another's partials: these do.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from portal.errors import PermissionDenied
from portal.forms import MemberAddForm
from portal.htmx import HTMX_STOP_POLLING, render_partial_or_page, wants_partial
from portal.middleware import SESSION_KEY
from portal.models import Role, User
from portal.selectors import (
    invitation_list_pending,
    membership_list,
    project_list_visible_to,
    project_role_of,
)
from scheduler.core.reasons import PendingReason
from scheduler.estimates import job_hourly_cost, model_availability
from scheduler.models import ACTIVE_STATES, Allocation, Job, JobEvent, JobState, Node, PriorityClass
from scheduler.ops_views import node_actions, slurm_node_actions, staff_required
from scheduler.selectors import (
    job_get_visible,
    job_list_visible_to,
    job_members,
    job_placement,
    latest_telemetry,
    project_quota_usage,
    project_with_quota,
    with_landed_model,
)
from web.help_examples import EXAMPLES, SETUP


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """The researcher's dashboard: my active jobs, GPU-hours against quota, models available."""
    user = _user(request)
    projects = list(project_list_visible_to(user=user).select_related("quota"))
    # The 20 ids first, from narrow rows (a long history holds thousands of the user's jobs),
    # then those jobs with what the table shows.
    mine = job_list_visible_to(user=user).filter(
        submitted_by=user, state__in=[*ACTIVE_STATES, JobState.QUEUED]
    )
    ids = list(mine.order_by("state", "-created_at").values_list("pk", flat=True)[:20])
    my_jobs = with_landed_model(mine.filter(pk__in=ids).order_by("state", "-created_at"))
    usage = [{"project": p, "rows": project_quota_usage(project=p)[:2]} for p in projects[:8]]
    return render(
        request,
        "web/home.html",
        {
            "projects": projects,
            "my_jobs": my_jobs,
            "usage": usage,
            "availability": model_availability(),
        },
    )


@login_required
def project_detail(request: HttpRequest, slug: str) -> HttpResponse:
    project = project_with_quota(user=_user(request), slug=slug)
    request.session[SESSION_KEY] = project.slug
    role = project_role_of(user=_user(request), project=project)
    context = {
        "project": project,
        "role": role,
        "is_owner": role == Role.OWNER,
        "memberships": membership_list(project=project),
        "quota_rows": project_quota_usage(project=project),
        "add_form": MemberAddForm(),
        "invitations": invitation_list_pending(project=project) if role == Role.OWNER else [],
        "roles": Role.choices,
    }
    return render(request, "web/project_detail.html", context)


def requeue_event(job: Job) -> JobEvent | None:
    """The event that put a waiting job back in the queue after it was preempted or lost its
    node (it kept its place: `scheduler.transitions.KEEPS_ITS_PLACE`), else None."""
    if job.state != JobState.QUEUED:
        return None
    last = job.events.order_by("-created_at", "-pk").first()
    if last is None or last.from_state not in (JobState.PREEMPTING, JobState.LOST):
        return None
    return last


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = job_get_visible(user=_user(request), job_id=job_id)
    role = project_role_of(user=_user(request), project=job.project)
    context = {
        "job": job,
        "priority": PriorityClass(job.priority).label,
        "events": job.events.all(),
        "placement": job_placement(job),
        "members": job_members(job),
        "can_cancel": role in (Role.OWNER, Role.MEMBER) and not job.is_terminal,
        "can_submit": role in (Role.OWNER, Role.MEMBER),
        "can_resize": role in (Role.OWNER, Role.MEMBER)
        and job.state == JobState.RUNNING
        and (job.elastic_min is not None or job.elastic_max is not None)
        and not job.resize,
        "hourly_cost": job_hourly_cost(job),
        # a job that ended without ever holding a GPU has no telemetry, efficiency or logs
        "never_ran": job.is_terminal and not job.allocations.exists(),
        "dependencies": list(job.dependencies.order_by("pk")) if not wants_partial(request) else [],
        "requeued": requeue_event(job),
    }
    return render_partial_or_page(
        request,
        page="web/job_detail.html",
        partial="scheduler/partials/_job_status.html",
        context=context,
        # htmx stops polling on 286 (and still swaps): an ended job's status changes no more
        status=HTMX_STOP_POLLING if job.is_terminal and wants_partial(request) else 200,
    )


@staff_required
def node_detail(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("pool", "autoscaler"), pk=node_id)
    gpus = list(node.gpus.select_related("model").order_by("index"))
    samples = latest_telemetry([g.pk for g in gpus])
    work: dict[int, list[Allocation]] = {}
    for a in Allocation.objects.filter(node=node, ended_at__isnull=True).select_related(
        "job", "job__project"
    ):
        work.setdefault(a.gpu_id, []).append(a)
    context = {
        "node": node,
        "gpus": [
            {"gpu": g, "sample": samples.get(g.pk, {}), "work": work.get(g.pk, [])} for g in gpus
        ],
        "jobs": Job.objects.filter(allocations__node=node, allocations__ended_at__isnull=True)
        .distinct()
        .select_related("project"),
        "events": node.events.select_related("gpu")[:50],
        "actions": node_actions(node),
        "slurm_actions": slurm_node_actions(node),
    }
    return render_partial_or_page(
        request,
        page="web/node_detail.html",
        partial="ops/partials/_node_gpus.html",
        context=context,
    )


@login_required
def project_requests(request: HttpRequest, slug: str) -> HttpResponse:
    """A project's quota and reservation requests, and the limits its owners set: owners ask
    and edit here, operators see it too; members and viewers are refused."""
    from billing.forms import ReservationRequestForm
    from billing.models import Budget, ReservationRequest
    from scheduler.forms import OwnerLimitsForm, QuotaRequestForm
    from scheduler.models import QuotaRequest

    user = _user(request)
    project = project_with_quota(user=user, slug=slug)
    role = project_role_of(user=user, project=project)
    if role != Role.OWNER and not user.is_staff:
        raise PermissionDenied(f"Your role in {project.name} is {role}; requests are for owners.")
    quota = project.quota
    context = {
        "project": project,
        "quota": quota,
        "is_owner": role == Role.OWNER,
        "model_limits": quota.model_limits.select_related("gpu_model").order_by("gpu_model__name"),
        "quota_requests": QuotaRequest.objects.filter(project=project)
        .select_related("requested_by", "decided_by", "gpu_model")
        .order_by("-created_at")[:50],
        "reservation_requests": ReservationRequest.objects.filter(project=project)
        .select_related("requested_by", "decided_by", "gpu_model", "plan")
        .order_by("-created_at")[:50],
        "budget": Budget.objects.filter(project=project).first(),
        "quota_form": QuotaRequestForm(),
        "reservation_form": ReservationRequestForm(),
        "limits_form": OwnerLimitsForm(initial={"max_gpus_per_member": quota.max_gpus_per_member}),
    }
    return render(request, "web/project_requests.html", context)


@staff_required
def request_queue(request: HttpRequest) -> HttpResponse:
    """Operators: pending quota, reservation and storage quota requests, oldest first, and
    recent decisions."""
    from django.conf import settings
    from django.db.models import F, Value
    from django.db.models.functions import Coalesce

    from billing.models import ReservationRequest
    from portal.approvals import PENDING
    from scheduler.models import QuotaRequest, RequestStatus
    from storage.models import StorageQuotaRequest

    quota_qs = QuotaRequest.objects.select_related(
        "project", "project__quota", "requested_by", "decided_by", "gpu_model"
    )
    reservation_qs = ReservationRequest.objects.select_related(
        "project", "requested_by", "decided_by", "gpu_model"
    )
    storage_qs = StorageQuotaRequest.objects.select_related(
        "project", "requested_by", "decided_by"
    ).annotate(
        now_gib=Coalesce(
            F("project__storage_quota__max_gib"), Value(settings.STORAGE_DEFAULT_QUOTA_GIB)
        )
    )
    context = {
        "quota_pending": quota_qs.filter(status=RequestStatus.PENDING).order_by("created_at"),
        "reservation_pending": reservation_qs.filter(
            status=ReservationRequest.Status.PENDING
        ).order_by("created_at"),
        "storage_pending": storage_qs.filter(status=PENDING).order_by("created_at"),
        "quota_decided": quota_qs.exclude(status=RequestStatus.PENDING).order_by("-decided_at")[
            :20
        ],
        "reservation_decided": reservation_qs.exclude(
            status=ReservationRequest.Status.PENDING
        ).order_by("-decided_at")[:20],
        "storage_decided": storage_qs.exclude(status=PENDING).order_by("-decided_at")[:20],
    }
    return render(request, "web/request_queue.html", context)


@login_required
def help_page(request: HttpRequest) -> HttpResponse:
    """The concepts (quotas, shares, preemptible, reservations, pending reasons) and API
    examples in curl, Python and the CLI (`web/help_examples.py`, run by the tests)."""
    return render(
        request,
        "web/help.html",
        {
            "examples": EXAMPLES,
            "setup": SETUP,
            "reasons": [(r.value, r.label, r.can_start_later) for r in PendingReason],
        },
    )
