"""Registration: the inventory an agent reports (GPUs by slot and UUID, driver, CPU, memory)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from scheduler.dispatch import assignments_changed
from scheduler.models import Allocation, Gpu, GpuModel, Node, NodeEvent
from scheduler.nodes.faults import jobs_holding, requeue_after_fault
from scheduler.nodes.states import node_transition


def gpu_model_for_product(product: str) -> GpuModel | None:
    """Map an NVML product name (or a catalog name) to the catalog."""
    for model in GpuModel.objects.all():
        if product == model.name or product in model.nvml_names:
            return model
    return None


@transaction.atomic
def node_register(*, node: Node, inventory: dict[str, Any]) -> Node:
    """Record the inventory an agent reports. GPUs are matched by UUID; unknown products refused."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    gpus = inventory["gpus"]
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
    indexes = [g["index"] for g in gpus]
    if len(set(indexes)) != len(indexes) or len({g["uuid"] for g in gpus}) != len(gpus):
        raise DomainError("GPU indexes and UUIDs must be unique on a node.", field="gpus")
    taken = Gpu.objects.filter(uuid__in=[g["uuid"] for g in gpus]).exclude(node=node)
    if taken.exists():
        raise Conflict("A GPU UUID in this inventory belongs to another node.")
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
        slot.save(update_fields=["uuid", "model", "memory_mib", "health"])
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
    node.cuda_version = inventory.get("cuda_version", "")[:16]
    if inventory.get("cpu_milli"):
        node.cpu_milli = inventory["cpu_milli"]
    if inventory.get("memory_mib"):
        node.memory_mib = inventory["memory_mib"]
    node.last_heartbeat_at = timezone.now()
    came_back = node.state == Node.State.LOST
    node.save()
    if node.state in (Node.State.PROVISIONING, Node.State.LOST):
        node_transition(
            node=node,
            to=Node.State.READY,
            kind="node_registered",
            message=f"Registered {len(gpus)} GPU(s); ready for work"
            + (" (it had been lost)" if came_back else ""),
        )
    assignments_changed([node.pk])  # GPU slots may hold other devices now
    audit_record(
        actor=None,
        action="node.register",
        target=node,
        data={"gpus": len(gpus), "came_back": came_back, "driver": node.driver_version},
    )
    return node
