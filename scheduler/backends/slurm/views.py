"""Ops page actions on Slurm nodes: drain and resume through `scontrol update`."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from portal.errors import DomainError
from portal.models import User
from scheduler.backends.slurm.nodes import node_drain
from scheduler.models import Node
from scheduler.ops_views import staff_required


@staff_required
@require_POST
def slurm_node_action(request: HttpRequest, node_id: int, action: str) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("pool__slurm"), pk=node_id)
    if request.POST.get("confirm") != node.name:
        messages.error(request, f"Type the node name ({node.name}) to confirm.")
        return redirect("ops-node-detail", node_id=node.pk)
    user: User = request.user  # type: ignore[assignment]
    try:
        node_drain(
            actor=user,
            node=node,
            action=action,
            reason=request.POST.get("reason", ""),
            remote_addr=request.META.get("REMOTE_ADDR"),
        )
        messages.success(request, f"{node.name}: {action} done in Slurm.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("ops-node-detail", node_id=node.pk)
