"""Operator pages: nodes and their health, node actions, pools and autoscalers, the queue."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.errors import DomainError
from portal.htmx import render_partial_or_page
from portal.models import User
from scheduler.core.reasons import PendingReason
from scheduler.models import Autoscaler, Gpu, Job, JobState, Node, Pool
from scheduler.nodes import loss_storm, node_faults_confirm, node_set_state
from scheduler.selectors import latest_telemetry


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @login_required
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_staff:
            raise PermissionDenied("Operators only.")
        return view(request, *args, **kwargs)

    return wrapper


@staff_required
def node_list(request: HttpRequest) -> HttpResponse:
    nodes = list(
        Node.objects.exclude(state=Node.State.RETIRED)
        .select_related("pool")
        .prefetch_related(Prefetch("gpus", queryset=Gpu.objects.select_related("model")))
        .annotate(active=Count("allocations", filter=Q(allocations__ended_at__isnull=True)))
        .order_by("pool__name", "name")
    )
    samples = latest_telemetry([g.pk for n in nodes for g in n.gpus.all()])
    rows = []
    for node in nodes:
        gpus = list(node.gpus.all())
        utils = [
            samples[g.pk]["utilization"]
            for g in gpus
            if samples.get(g.pk, {}).get("utilization") is not None
        ]
        models: dict[str, int] = {}
        for g in gpus:
            models[g.model.name] = models.get(g.model.name, 0) + 1
        rows.append(
            {
                "node": node,
                "models": ", ".join(f"{n} × {m}" for m, n in models.items()),
                "unhealthy": sum(g.health == Gpu.Health.UNHEALTHY for g in gpus),
                "degraded": sum(g.health == Gpu.Health.DEGRADED for g in gpus),
                "util": round(sum(utils) / len(utils)) if utils else None,
                "gpus": len(gpus),
            }
        )
    return render_partial_or_page(
        request,
        page="ops/node_list.html",
        partial="ops/partials/_node_table.html",
        context={"rows": rows, "loss_storm": loss_storm()},
    )


def slurm_node_actions(node: Node) -> list[tuple[str, str, str]]:
    """A Slurm node is drained and resumed in Slurm (scontrol update), not by our agents."""
    if node.provider != Node.Provider.SLURM:
        return []
    if "drain" in str(node.labels.get("slurm_state", "")):
        return [("resume", "Resume", "Slurm schedules jobs on it again.")]
    return [("drain", "Drain", "Slurm lets its jobs finish and starts no new ones on it.")]


def node_actions(node: Node) -> list[tuple[str, str, str]]:
    """(action, label, confirmation) the node's state allows."""
    if node.provider == Node.Provider.SLURM:
        return []  # Slurm's own: slurm_node_actions
    options: dict[str, list[tuple[str, str, str]]] = {
        Node.State.READY: [
            ("cordon", "Cordon", "No new work will be placed on it."),
            ("drain", "Drain", "Running jobs are preempted and requeued elsewhere."),
        ],
        Node.State.CORDONED: [
            ("uncordon", "Uncordon", "It takes new work again."),
            ("drain", "Drain", "Running jobs are preempted and requeued elsewhere."),
            ("retire", "Retire", "It leaves the fleet for good."),
        ],
        Node.State.DRAINING: [("uncordon", "Uncordon", "Stop draining; it takes new work again.")],
        Node.State.UNHEALTHY: [
            ("reset_health", "Reset health", "Mark its GPUs healthy after you checked them."),
            ("retire", "Retire", "It leaves the fleet for good."),
        ],
        Node.State.LOST: [("retire", "Retire", "It leaves the fleet for good.")],
        Node.State.QUARANTINED: [
            (
                "approve_inventory",
                "Approve inventory",
                "Its new hardware is applied and it takes work again: check the hardware first.",
            ),
            ("retire", "Retire", "It leaves the fleet for good."),
        ],
    }
    actions = list(options.get(node.state, []))
    if (
        node.state != Node.State.RETIRED
        and node.gpus.filter(fault_at__isnull=False, fault_corroborated_at__isnull=True).exists()
    ):
        actions.append(
            (
                "confirm_faults",
                "Confirm GPU faults",
                "You checked the hardware: the work its faults ended is credited to the users.",
            )
        )
    if node.state == Node.State.READY and node.gpus.filter(health=Gpu.Health.UNHEALTHY).exists():
        actions.append(
            ("reset_health", "Reset GPU health", "Mark its GPUs healthy after you checked them.")
        )
    return actions


@staff_required
@require_POST
def node_action(request: HttpRequest, node_id: int, action: str) -> HttpResponse:
    node = get_object_or_404(Node, pk=node_id)
    if request.POST.get("confirm") != node.name:
        messages.error(request, f"Type the node name ({node.name}) to confirm.")
        return redirect("ops-node-detail", node_id=node.pk)
    try:
        user: User = request.user  # type: ignore[assignment]
        remote_addr = request.META.get("REMOTE_ADDR")
        if action == "confirm_faults":
            node_faults_confirm(actor=user, node=node, remote_addr=remote_addr)
        else:
            node_set_state(actor=user, node=node, action=action, remote_addr=remote_addr)
        messages.success(request, f"{node.name}: {action.replace('_', ' ')} done.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("ops-node-detail", node_id=node.pk)


@staff_required
def pool_list(request: HttpRequest) -> HttpResponse:
    pools = (
        Pool.objects.select_related("slurm")
        .prefetch_related(
            Prefetch(
                "autoscalers",
                queryset=Autoscaler.objects.select_related("gpu_model").prefetch_related(
                    "decisions"
                ),
            )
        )
        .annotate(
            node_count=Count("nodes", filter=~Q(nodes__state=Node.State.RETIRED), distinct=True)
        )
    )
    rows = []
    for pool in pools:
        scalers = []
        for s in pool.autoscalers.all():
            scalers.append({"scaler": s, "decisions": list(s.decisions.all()[:8])})
        rows.append({"pool": pool, "scalers": scalers, "slurm": getattr(pool, "slurm", None)})
    queue = [
        {**q, "reason": reason_label(q["pending_reason"])}
        for q in Job.objects.filter(state=JobState.QUEUED)
        .values("gpu_model__name", "pending_reason")
        .annotate(jobs=Count("pk"))
        .order_by("gpu_model__name")
    ]
    return render(request, "ops/pool_list.html", {"rows": rows, "queue": queue})


def reason_label(code: str) -> str:
    """A pending reason in words for a page ('' before the first cycle has planned the job)."""
    if not code:
        return ""
    try:
        return PendingReason(code).label
    except ValueError:  # a reason from elsewhere (a Slurm pool's words): shown as it is
        return code
