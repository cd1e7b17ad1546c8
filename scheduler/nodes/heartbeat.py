"""Heartbeats: liveness, fencing of a lost node that returns, and telemetry intake (cached
latest samples, health assessment per GPU, telemetry sinks)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from scheduler import health, ports
from scheduler.dispatch import assignments_changed
from scheduler.models import Node, NodeEvent
from scheduler.nodes.gpu_health import gpu_health_apply
from scheduler.nodes.states import node_transition
from scheduler.selectors import telemetry_key

TELEMETRY_TTL_S = 120


@transaction.atomic
def node_heartbeat(
    *, node: Node, telemetry: list[dict[str, Any]], running: list[dict[str, Any]]
) -> Node:
    """Record liveness and the latest telemetry; a lost node that returns is fenced."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    now = timezone.now()
    node.last_heartbeat_at = now
    fields = ["last_heartbeat_at", "updated_at"]
    if node.state == Node.State.LOST:
        node.fenced = True
        node_transition(
            node=node,
            # a node quarantined before it was lost stays so until an operator approves it
            to=Node.State.QUARANTINED if node.pending_inventory else Node.State.READY,
            kind="node_returned",
            severity=NodeEvent.Severity.WARNING,
            message="A lost node sent a heartbeat: fenced until it has stopped its old work",
            action="node.return_fenced",
            data={},
            update_fields=("fenced", "last_heartbeat_at"),
        )
        fields.append("fenced")
    if node.fenced and not running:
        node.fenced = False
        fields.append("fenced")
        audit_record(actor=None, action="node.unfence", target=node)
    if "fenced" in fields:
        assignments_changed([node.pk])
    node.save(update_fields=fields)
    gpus = {g.uuid: g for g in node.gpus.all()}
    newest: dict[str, dict[str, Any]] = {}  # a heartbeat carries several instants per GPU
    for s in telemetry:
        seen = newest.get(s.get("uuid", ""))
        if s.get("uuid") in gpus and (seen is None or s.get("age_s", 0) <= seen.get("age_s", 0)):
            newest[s["uuid"]] = s
    cache.set_many(
        {
            telemetry_key(gpus[uuid].pk): {
                **s,
                "at": (now - timedelta(seconds=float(s.get("age_s") or 0))).isoformat(),
            }
            for uuid, s in newest.items()
        },
        timeout=TELEMETRY_TTL_S,
    )
    for sample in telemetry:
        gpu = gpus.get(sample.get("uuid", ""))
        if gpu is not None:
            taken = now - timedelta(seconds=float(sample.get("age_s") or 0))
            gpu_health_apply(node, gpu, health.assess(sample), at=taken, received=now)
    known = [{**s, "gpu_id": gpus[s["uuid"]].pk} for s in telemetry if s.get("uuid") in gpus]
    for sink in ports.TELEMETRY_SINKS:
        sink(node=node, samples=known, now=now)
    return node
