"""The loss sweep: nodes silent too long become lost and their jobs are requeued; a storm of
silent nodes (likelier the portal's fault than theirs) holds the sweep off."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from scheduler.cycle_requests import request_cycle
from scheduler.models import Allocation, Job, Node, NodeEvent
from scheduler.nodes.faults import requeue_after_fault
from scheduler.nodes.states import node_transition

log = logging.getLogger(__name__)

LOSS_STORM_KEY = "scheduler:loss-storm"


def loss_storm() -> dict[str, Any] | None:
    """What the last loss sweep held off for (most nodes silent at once), or None."""
    found = cache.get(LOSS_STORM_KEY)
    return found if isinstance(found, dict) else None


def lost_nodes_sweep(*, now: datetime | None = None) -> list[int]:
    """Nodes silent for longer than NODE_LOST_AFTER_SECONDS become lost; their jobs are requeued
    (or failed when they may not restart). Returns the ids of the nodes marked lost."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS)
    watched = Node.objects.filter(
        state__in=[
            Node.State.READY,
            Node.State.CORDONED,
            Node.State.DRAINING,
            Node.State.UNHEALTHY,
        ]
    )
    silent = list(watched.filter(last_heartbeat_at__lt=cutoff).values_list("pk", flat=True))
    total = watched.count() if silent else 0
    if (
        len(silent) >= settings.NODE_LOSS_STORM_MIN_NODES
        and len(silent) > settings.NODE_LOSS_STORM_FRACTION * total
    ):
        # Most of the fleet silent at once: far likelier the portal (overloaded, partitioned)
        # than the nodes. Requeueing everything would make it worse; hold off and say so.
        log.warning(
            "loss sweep held off: %d of %d nodes silent for over %ss at once",
            len(silent),
            total,
            settings.NODE_LOST_AFTER_SECONDS,
        )
        cache.set(
            LOSS_STORM_KEY,
            {"silent": len(silent), "watched": total, "at": now.isoformat()},
            timeout=int(settings.NODE_LOST_AFTER_SECONDS) * 2,
        )
        return []
    cache.delete(LOSS_STORM_KEY)
    lost = []
    for node_id in silent:
        with transaction.atomic():
            node = Node.objects.select_for_update().get(pk=node_id)
            if node.last_heartbeat_at is None or node.last_heartbeat_at >= cutoff:
                continue
            node_transition(
                node=node,
                to=Node.State.LOST,
                kind="node_lost",
                severity=NodeEvent.Severity.CRITICAL,
                message=f"No heartbeat since {node.last_heartbeat_at:%Y-%m-%d %H:%M:%S} UTC; "
                "its jobs are requeued",
                action="node.lost",
                data={"last_heartbeat": node.last_heartbeat_at.isoformat()},
            )
            job_ids = set(
                Allocation.objects.filter(node=node, ended_at__isnull=True).values_list(
                    "job_id", flat=True
                )
            )
            for job in Job.objects.select_for_update().filter(pk__in=job_ids).order_by("pk"):
                _job_lost(job, node)
            lost.append(node.pk)
    if lost:
        request_cycle()
    return lost


def _job_lost(job: Job, node: Node) -> None:
    requeue_after_fault(
        job,
        f"Node {node.name} stopped answering",
        end_reason=Allocation.EndReason.NODE_LOST,
        actor="health-sweep",
    )
