"""The loss sweep: nodes silent too long become lost and their jobs are requeued, at a rate
per pool that slows when much of the pool is unhealthy and stops when all of it is silent
(`scheduler/eviction_rules.py`, Kubernetes' node lifecycle controller)."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from scheduler.cycle_requests import request_cycle
from scheduler.eviction_rules import Bucket, EvictionPolicy, PoolHealth, Verdict, sweep_verdict
from scheduler.models import Allocation, Job, Node, NodeEvent
from scheduler.nodes.faults import requeue_after_fault
from scheduler.nodes.states import node_transition

log = logging.getLogger(__name__)

LOSS_HELD_KEY = "scheduler:loss-held"
BUCKET_KEY = "scheduler:loss-bucket:{pool_id}"
WATCHED = (
    Node.State.READY,
    Node.State.CORDONED,
    Node.State.DRAINING,
    Node.State.UNHEALTHY,
    Node.State.QUARANTINED,  # it may still run work placed before
)


def eviction_policy() -> EvictionPolicy:
    return EvictionPolicy(
        unhealthy_threshold=settings.NODE_EVICTION_UNHEALTHY_THRESHOLD,
        min_unhealthy=settings.NODE_EVICTION_MIN_UNHEALTHY,
        primary_rate=settings.NODE_EVICTION_RATE,
        secondary_rate=settings.NODE_EVICTION_SECONDARY_RATE,
        large_pool_size=settings.NODE_EVICTION_LARGE_POOL,
        burst=settings.NODE_EVICTION_BURST,
    )


def loss_storm() -> dict[str, Any] | None:
    """What the last sweep held back (silent nodes it did not declare lost, and why), or None."""
    found = cache.get(LOSS_HELD_KEY)
    return found if isinstance(found, dict) else None


def _bucket(pool_id: int) -> Bucket | None:
    raw = cache.get(BUCKET_KEY.format(pool_id=pool_id))
    if isinstance(raw, dict) and {"tokens", "at"} <= raw.keys():
        return Bucket(tokens=float(raw["tokens"]), at=float(raw["at"]))
    return None


def _verdicts(now: datetime, cutoff: datetime) -> tuple[list[Verdict], dict[int, list[int]]]:
    """Each pool's verdict, and its silent nodes, longest silent first."""
    rows = Node.objects.filter(state__in=[*WATCHED, Node.State.LOST]).values_list(
        "pk", "pool_id", "pool__name", "state", "last_heartbeat_at"
    )
    names: dict[int, str] = {}
    healthy: dict[int, int] = defaultdict(int)
    lost: dict[int, int] = defaultdict(int)
    silent: dict[int, list[tuple[datetime, int]]] = defaultdict(list)
    for pk, pool_id, pool_name, state, heartbeat in rows:
        names[pool_id] = pool_name
        if state == Node.State.LOST:
            lost[pool_id] += 1
        elif heartbeat is not None and heartbeat < cutoff:
            silent[pool_id].append((heartbeat, pk))
        else:
            healthy[pool_id] += 1
    policy = eviction_policy()
    verdicts = []
    for pool_id in sorted(silent):
        verdict = sweep_verdict(
            names[pool_id],
            PoolHealth(healthy=healthy[pool_id], silent=len(silent[pool_id]), lost=lost[pool_id]),
            bucket=_bucket(pool_id),
            now=now.timestamp(),
            policy=policy,
        )
        cache.set(
            BUCKET_KEY.format(pool_id=pool_id),
            {"tokens": verdict.bucket.tokens, "at": verdict.bucket.at},
            timeout=24 * 3600,
        )
        verdicts.append(verdict)
    ordered = {pool_id: [pk for _, pk in sorted(nodes)] for pool_id, nodes in silent.items()}
    return verdicts, {
        pool_id: ordered[pool_id][: v.declare]
        for pool_id, v in zip(sorted(silent), verdicts, strict=True)
    }


def lost_nodes_sweep(*, now: datetime | None = None) -> list[int]:
    """Nodes silent for longer than NODE_LOST_AFTER_SECONDS become lost, as many as each pool's
    eviction rate allows (the longest silent first); their jobs are requeued (or failed when
    they may not restart). Returns the ids of the nodes marked lost."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS)
    verdicts, to_declare = _verdicts(now, cutoff)
    held = [v for v in verdicts if v.held]
    if held:
        for v in held:
            log.warning("loss sweep: %s", v.message)
        cache.set(
            LOSS_HELD_KEY,
            {
                "silent": sum(v.held + v.declare for v in verdicts),
                "held": sum(v.held for v in held),
                "watched": Node.objects.filter(state__in=WATCHED).count(),
                "messages": [v.message for v in held],
                "at": now.isoformat(),
            },
            timeout=int(settings.NODE_LOST_AFTER_SECONDS) * 2,
        )
    else:
        cache.delete(LOSS_HELD_KEY)
    lost = []
    for node_id in (pk for ids in to_declare.values() for pk in ids):
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
