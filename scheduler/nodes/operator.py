"""Operator actions on a node: cordon, uncordon, drain, reset health, approve a quarantined
node's new inventory, retire."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from portal.errors import Conflict, DomainError
from portal.models import User
from scheduler.models import STOPPABLE_STATES, Gpu, JobState, Node
from scheduler.nodes.faults import gpu_fault_corroborate, jobs_holding
from scheduler.nodes.inventory import node_inventory_approve
from scheduler.nodes.states import node_transition
from scheduler.transitions import job_transition

# action -> (the states an operator may run it from, the state it leads to); every move is
# also checked against the node state machine (`scheduler.nodes.states`).
OPERATOR_ACTIONS: dict[str, tuple[frozenset[str], str]] = {
    "cordon": (frozenset({Node.State.READY}), Node.State.CORDONED),
    "uncordon": (frozenset({Node.State.CORDONED, Node.State.DRAINING}), Node.State.READY),
    "drain": (frozenset({Node.State.READY, Node.State.CORDONED}), Node.State.DRAINING),
    "reset_health": (
        frozenset({Node.State.READY, Node.State.UNHEALTHY, Node.State.CORDONED}),
        Node.State.READY,
    ),
    "approve_inventory": (frozenset({Node.State.QUARANTINED}), Node.State.READY),
    "retire": (
        frozenset(
            {Node.State.CORDONED, Node.State.LOST, Node.State.UNHEALTHY, Node.State.QUARANTINED}
        ),
        Node.State.RETIRED,
    ),
}


@transaction.atomic
def node_set_state(*, actor: User, node: Node, action: str, remote_addr: str | None = None) -> Node:
    """Operator actions: cordon (no new work), uncordon, drain (no new work; running work
    ends), reset health (GPUs back in service), retire (for good; its token stops working)."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    if action not in OPERATOR_ACTIONS:
        raise DomainError(f"Unknown node action '{action}'.", field="action")
    sources, target = OPERATOR_ACTIONS[action]
    if node.state not in sources:
        raise Conflict(f"Node {node.name} is {node.state}; it cannot {action}.")
    if action == "approve_inventory":
        return node_inventory_approve(actor=actor, node=node, remote_addr=remote_addr)
    if action == "retire" and node.allocations.filter(ended_at__isnull=True).exists():
        raise Conflict(f"Node {node.name} still runs work; drain it first.")
    old = node.state
    if action == "reset_health":
        node.gpus.update(health=Gpu.Health.HEALTHY)
    node_transition(
        node=node,
        to=target,
        kind=f"operator_{action}",
        message=f"{actor.email} ran {action.replace('_', ' ')} ({old} → {target})",
        actor=actor,
        action=f"node.{action}",
        remote_addr=remote_addr,
    )
    if action == "drain":
        for job in jobs_holding(node=node).filter(state__in=STOPPABLE_STATES):
            job.preempt_deadline = timezone.now() + timedelta(seconds=job.grace_seconds)
            job_transition(
                job=job,
                to=JobState.PREEMPTING,
                reason=f"Node {node.name} is being drained by an operator; the job will be requeued",
                actor=actor,
                update_fields=("preempt_deadline",),
            )
    return node


@transaction.atomic
def node_faults_confirm(*, actor: User, node: Node, remote_addr: str | None = None) -> int:
    """An operator confirms the node's open GPU faults (after looking at the hardware): the
    work they ended becomes creditable. Returns the allocations corroborated; audited."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    gpus = list(
        node.gpus.select_for_update().filter(
            fault_at__isnull=False, fault_corroborated_at__isnull=True
        )
    )
    if not gpus:
        raise Conflict(f"Node {node.name} has no unconfirmed GPU fault.")
    return sum(
        gpu_fault_corroborate(gpu, how="operator", actor=actor, remote_addr=remote_addr)
        for gpu in gpus
    )
