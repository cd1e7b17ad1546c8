"""Seeding: the GPU catalog's entries and simulated nodes, for the demo (`seed_demo`), the tests
and the benchmarks. Real nodes come from provisioning (`scheduler/provisioning.py`) and their
agents' registration."""

from __future__ import annotations

import uuid

from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.models import User
from scheduler.catalog import GPU_CATALOG
from scheduler.models import Gpu, GpuModel, Node, Pool


@transaction.atomic
def catalog_seed(*, actor: User | None = None) -> int:
    """Create catalog entries that are missing; never overwrite edited specs or prices."""
    created = 0
    for spec in GPU_CATALOG:
        _, was_created = GpuModel.objects.get_or_create(name=spec["name"], defaults=spec)
        created += was_created
    if created:
        audit_record(actor=actor, action="catalog.seed", data={"created": created})
    return created


@transaction.atomic
def node_register_simulated(
    *,
    name: str,
    pool: Pool,
    gpu_model: GpuModel,
    gpu_count: int,
    cpu_milli: int,
    memory_mib: int,
    sharing_mode: str = Gpu.SharingMode.EXCLUSIVE,
    oversubscription: int = 1,
    state: str = Node.State.PROVISIONING,
    actor: User | None = None,
) -> Node:
    """A simulated node with `gpu_count` GPUs of one model. It stays provisioning until its
    agent registers, unless created `ready` (with a heartbeat now, as tests do)."""
    node, created = Node.objects.get_or_create(
        name=name,
        defaults={
            "pool": pool,
            "provider": Node.Provider.SIMULATED,
            "state": state,
            "last_heartbeat_at": timezone.now() if state == Node.State.READY else None,
            "cpu_milli": cpu_milli,
            "memory_mib": memory_mib,
            "labels": {"gpu.model": gpu_model.name},
        },
    )
    if not created:
        return node
    Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=i,
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{name}-{i}')}",
            model=gpu_model,
            memory_mib=gpu_model.memory_mib,
            sharing_mode=sharing_mode,
            oversubscription=oversubscription,
        )
        for i in range(gpu_count)
    )
    audit_record(
        actor=actor,
        action="node.create",
        target=node,
        data={"gpus": gpu_count, "model": gpu_model.name, "provider": "simulated"},
    )
    return node
