"""Registration: the inventory an agent reports (GPUs by slot and UUID, driver, CPU, memory).

The portal trusts a node's hardware once: the inventory of its first registration (GPU slots
with their model and memory, CPU, memory) is recorded as `registered_inventory`. A later
registration that reports other hardware — a stolen token re-registering the node as 64 ×
H200 so that victims' jobs land on GPUs that do not exist — is not applied: the node is
quarantined (nothing is placed on it) with the reported inventory pending, until an operator
approves it (`node_inventory_approve`) or retires the node. A GPU replaced by one of the same
model (a new UUID in the same slot) is not a difference.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import User
from scheduler.core.model import GANG_LABEL, GANG_REASON_LABEL
from scheduler.dispatch import assignments_changed
from scheduler.models import Allocation, Gpu, GpuModel, Node, NodeEvent
from scheduler.nodes.faults import gpu_fault_record, jobs_holding, requeue_after_fault
from scheduler.nodes.states import node_transition


def gpu_model_for_product(product: str) -> GpuModel | None:
    """Map an NVML product name (or a catalog name) to the catalog."""
    for model in GpuModel.objects.all():
        if product == model.name or product in model.nvml_names:
            return model
    return None


def inventory_summary(inventory: dict[str, Any]) -> dict[str, Any]:
    """What the portal trusts of an inventory: GPU slots (index, catalog model, memory, MIG),
    CPU and memory; not UUIDs, drivers or the hostname."""
    models = _catalog_models(inventory["gpus"])
    return {
        "gpus": sorted(
            [g["index"], models[g["uuid"]].name, g["memory_mib"], bool(g.get("mig_mode"))]
            for g in inventory["gpus"]
        ),
        "cpu_milli": inventory.get("cpu_milli") or 0,
        "memory_mib": inventory.get("memory_mib") or 0,
    }


def _inventory_check(node: Node, gpus: list[dict[str, Any]]) -> None:
    """Refuse an inventory no node can have: repeated slots or UUIDs, another node's GPU."""
    indexes = [g["index"] for g in gpus]
    if len(set(indexes)) != len(indexes) or len({g["uuid"] for g in gpus}) != len(gpus):
        raise DomainError("GPU indexes and UUIDs must be unique on a node.", field="gpus")
    taken = Gpu.objects.filter(uuid__in=[g["uuid"] for g in gpus]).exclude(node=node)
    if taken.exists():
        raise Conflict("A GPU UUID in this inventory belongs to another node.")


def _describe(summary: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for _, model, _, _ in summary["gpus"]:
        counts[model] = counts.get(model, 0) + 1
    gpus = ", ".join(f"{n} × {m}" for m, n in sorted(counts.items())) or "no GPUs"
    return f"{gpus}; {summary['cpu_milli']} mCPU, {summary['memory_mib']} MiB"


def _catalog_models(gpus: list[dict[str, Any]]) -> dict[str, GpuModel]:
    models = {}
    for gpu in gpus:
        model = gpu_model_for_product(gpu["name"])
        if model is None:
            raise DomainError(
                f"GPU product '{gpu['name']}' is not in the catalog; an operator must add it "
                "(or its NVML name) first.",
                field="gpus",
            )
        models[gpu["uuid"]] = model
    return models


@transaction.atomic
def node_register(*, node: Node, inventory: dict[str, Any]) -> Node:
    """Record the inventory an agent reports. GPUs are matched by UUID; unknown products refused.

    Other hardware than the node registered before quarantines it instead (see the module).
    """
    node = Node.objects.select_for_update().get(pk=node.pk)
    summary = inventory_summary(inventory)  # refuses products the catalog does not know
    _inventory_check(node, inventory["gpus"])
    if node.registered_inventory is not None and (
        summary != node.registered_inventory or node.state == Node.State.QUARANTINED
    ):
        return _quarantine(node, inventory, summary)
    _inventory_apply(node, inventory)
    node.registered_inventory = summary
    node.last_heartbeat_at = timezone.now()
    came_back = node.state == Node.State.LOST
    node.save()
    if node.state in (Node.State.PROVISIONING, Node.State.LOST):
        node_transition(
            node=node,
            to=Node.State.READY,
            kind="node_registered",
            message=f"Registered {len(inventory['gpus'])} GPU(s); ready for work"
            + (" (it had been lost)" if came_back else ""),
        )
    assignments_changed([node.pk])  # GPU slots may hold other devices now
    audit_record(
        actor=None,
        action="node.register",
        target=node,
        data={
            "gpus": len(inventory["gpus"]),
            "came_back": came_back,
            "driver": node.driver_version,
            "gang_members": node.labels.get(GANG_LABEL) != "no",
        },
    )
    return node


def _quarantine(node: Node, inventory: dict[str, Any], summary: dict[str, Any]) -> Node:
    """Keep the reported inventory pending and take the node out of placement."""
    node.pending_inventory = inventory
    node.last_heartbeat_at = timezone.now()
    message = (
        f"Registered other hardware ({_describe(summary)}) than before "
        f"({_describe(node.registered_inventory or {'gpus': [], 'cpu_milli': 0, 'memory_mib': 0})}); "
        "nothing is placed on it until an operator approves the new inventory"
    )
    data = {"registered": node.registered_inventory, "reported": summary}
    if node.state == Node.State.QUARANTINED:
        node.save(update_fields=["pending_inventory", "last_heartbeat_at", "updated_at"])
        NodeEvent.objects.create(
            node=node,
            severity=NodeEvent.Severity.CRITICAL,
            kind="inventory_differs",
            message=message[:500],
        )
        audit_record(actor=None, action="node.inventory_differs", target=node, data=data)
    else:
        node_transition(
            node=node,
            to=Node.State.QUARANTINED,
            kind="node_quarantined",
            severity=NodeEvent.Severity.CRITICAL,
            message=message,
            action="node.quarantine",
            data=data,
            update_fields=("pending_inventory", "last_heartbeat_at"),
        )
    return node


@transaction.atomic
def node_inventory_approve(*, actor: User, node: Node, remote_addr: str | None = None) -> Node:
    """An operator approves a quarantined node's new inventory: it is applied, becomes the
    registered one, and the node is ready again. Audited."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.state != Node.State.QUARANTINED or node.pending_inventory is None:
        raise Conflict(f"Node {node.name} is {node.state}; it has no inventory to approve.")
    inventory = node.pending_inventory
    summary = inventory_summary(inventory)
    _inventory_apply(node, inventory)
    before = node.registered_inventory
    node.registered_inventory, node.pending_inventory = summary, None
    node.save()
    node_transition(
        node=node,
        to=Node.State.READY,
        kind="inventory_approved",
        message=f"{actor.email} approved the new inventory ({_describe(summary)})",
        actor=actor,
        action="node.approve_inventory",
        data={"registered": before, "approved": summary},
        remote_addr=remote_addr,
    )
    assignments_changed([node.pk])
    return node


def _inventory_apply(node: Node, inventory: dict[str, Any]) -> None:
    """Write the inventory onto the node's GPU slots, driver, CPU and memory (not saved: the
    caller saves the node)."""
    gpus = inventory["gpus"]
    models = _catalog_models(gpus)
    indexes = [g["index"] for g in gpus]
    _inventory_check(node, gpus)
    # A Gpu row is a slot (node, index); the device in it may be replaced (a new UUID).
    slots = {g.index: g for g in node.gpus.all()}
    replaced = [
        (slots[g["index"]], g)
        for g in gpus
        if g["index"] in slots and slots[g["index"]].uuid != g["uuid"]
    ]
    for row, _ in replaced:  # free the old UUIDs first: two slots may swap devices
        row.uuid = f"replaced-{row.pk}"
        row.save(update_fields=["uuid"])
    for row, reported in replaced:
        for job in jobs_holding(gpu=row):
            requeue_after_fault(
                job,
                f"GPU {row.index} on {node.name} was replaced",
                end_reason=Allocation.EndReason.GPU_FAULT,
                actor=f"agent:{node.name}",
            )
        NodeEvent.objects.create(
            node=node,
            gpu=row,
            kind="gpu_replaced",
            message=f"GPU {row.index} now reports UUID {reported['uuid']}",
        )
        row.health = Gpu.Health.HEALTHY
        gpu_fault_record(row, at=timezone.now())  # credited once an operator confirms it
    for gpu in gpus:
        slot = slots.get(gpu["index"])
        if slot is None:
            Gpu.objects.create(
                node=node,
                index=gpu["index"],
                uuid=gpu["uuid"],
                model=models[gpu["uuid"]],
                memory_mib=gpu["memory_mib"],
                sharing_mode=Gpu.SharingMode.MIG
                if gpu.get("mig_mode")
                else Gpu.SharingMode.EXCLUSIVE,
            )
            continue
        slot.uuid, slot.model, slot.memory_mib = gpu["uuid"], models[gpu["uuid"]], gpu["memory_mib"]
        slot.save(
            update_fields=[
                "uuid",
                "model",
                "memory_mib",
                "health",
                "fault_at",
                "fault_corroborated_at",
            ]
        )
    for index, row in slots.items():  # a device that vanished: unhealthy, not deleted
        if index not in indexes and row.health != Gpu.Health.UNHEALTHY:
            row.health = Gpu.Health.UNHEALTHY
            row.save(update_fields=["health"])
            NodeEvent.objects.create(
                node=node,
                gpu=row,
                severity=NodeEvent.Severity.CRITICAL,
                kind="gpu_missing",
                message=f"GPU {index} is missing from the node's inventory",
            )
    node.driver_version = inventory.get("driver_version", "")[:32]
    node.address = (inventory.get("address") or "")[:255]
    node.cuda_version = inventory.get("cuda_version", "")[:16]
    if inventory.get("cpu_milli"):
        node.cpu_milli = inventory["cpu_milli"]
    if inventory.get("memory_mib"):
        node.memory_mib = inventory["memory_mib"]
    _gang_members_apply(node, inventory)


def _gang_members_apply(node: Node, inventory: dict[str, Any]) -> None:
    """Record whether the node's agent can run a member of a multi-node gang, as the reserved
    labels the planner reads (`scheduler.core.model.GANG_LABEL`); a change is a node event.
    An inventory without it (an older agent) counts as "it can" (see `agent.protocol`)."""
    can = inventory.get("gang_members", True) is not False
    reason = "" if can else (inventory.get("gang_members_reason") or "its agent says so")[:300]
    labels = {k: v for k, v in node.labels.items() if k not in (GANG_LABEL, GANG_REASON_LABEL)}
    labels[GANG_LABEL] = "yes" if can else "no"
    if reason:
        labels[GANG_REASON_LABEL] = reason
    before = node.labels.get(GANG_LABEL)
    node.labels = labels
    if before == labels[GANG_LABEL] or (before is None and can):
        return
    NodeEvent.objects.create(
        node=node,
        severity=NodeEvent.Severity.INFO if can else NodeEvent.Severity.WARNING,
        kind="gang_members",
        message=(
            "It can run members of multi-node gangs again"
            if can
            else f"It cannot run members of multi-node gangs: {reason}"
        )[:500],
    )
