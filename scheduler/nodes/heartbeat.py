"""Heartbeats: liveness, fencing of a lost node that returns, and telemetry intake (cached
latest samples, health assessment per GPU, telemetry sinks).

Fast path: on PostgreSQL one statement checks the agent's token, records the heartbeat (the
node's row stays locked until commit) and reads the node's GPUs (`_record_sql`), where the ORM
took four (the token, the locked row, its update, the GPUs); measured by `bench.agent_cost`.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.utils import timezone

from foundation.db import concrete_columns
from portal.audit import audit_record
from scheduler import gpu_health_rules, ports
from scheduler.dispatch import assignments_changed
from scheduler.models import Gpu, Node, NodeEvent
from scheduler.nodes.gpu_health import gpu_health_apply
from scheduler.nodes.states import node_transition
from scheduler.selectors import telemetry_key

TELEMETRY_TTL_S = 120
# What a heartbeat reads of its node, in the model's order (as `Model.from_db` takes them);
# the rest (inventories, labels) loads if ever asked for.
NODE_FIELDS = tuple(
    f
    for f in concrete_columns(Node)
    if f in {"id", "name", "state", "fenced", "last_heartbeat_at", "updated_at"}
)


@functools.cache
def _record_sql() -> str:
    """The statement of `_heartbeat_record` on PostgreSQL, built once from the models."""
    qn = connection.ops.quote_name

    def col(model: type[Node] | type[Gpu], attname: str) -> str:
        field = next(f for f in model._meta.concrete_fields if f.attname == attname)
        return qn(str(field.column))

    node_cols = ", ".join(col(Node, f) for f in NODE_FIELDS)
    gpu_cols = ", ".join(f"g.{col(Gpu, f)}" for f in concrete_columns(Gpu))
    return (
        f"WITH n AS (UPDATE {qn(Node._meta.db_table)} "  # noqa: S608 - names from _meta
        f"SET {col(Node, 'last_heartbeat_at')} = %s, {col(Node, 'updated_at')} = %s "
        f"WHERE {col(Node, 'id')} = %s AND {col(Node, 'agent_token_hash')} = %s "
        f"AND {col(Node, 'state')} <> %s RETURNING {node_cols}) "
        f"SELECT n.*, {gpu_cols} FROM n LEFT JOIN {qn(Gpu._meta.db_table)} g "
        f"ON g.{col(Gpu, 'node_id')} = n.{col(Node, 'id')} ORDER BY g.{col(Gpu, 'index')}"
    )


def _heartbeat_record(
    node_id: int, token_hash: str, now: datetime
) -> tuple[Node, list[Gpu]] | None:
    """The node (its `NODE_FIELDS`; locked, its heartbeat recorded) and its GPUs, if the token
    still names it and it is not retired; else None, and nothing is written."""
    if connection.vendor != "postgresql":
        found = (
            Node.objects.select_for_update()
            .filter(pk=node_id, agent_token_hash=token_hash)
            .exclude(state=Node.State.RETIRED)
            .only(*NODE_FIELDS)
            .first()
        )
        if found is None:
            return None
        found.last_heartbeat_at = now
        found.save(update_fields=["last_heartbeat_at", "updated_at"])
        return found, list(Gpu.objects.filter(node_id=node_id).order_by("index"))
    with connection.cursor() as cursor:
        cursor.execute(_record_sql(), [now, now, node_id, token_hash, Node.State.RETIRED])
        rows = cursor.fetchall()
    if not rows:
        return None
    width = len(NODE_FIELDS)
    node = Node.from_db(DEFAULT_DB_ALIAS, NODE_FIELDS, rows[0][:width])
    gpu_fields = concrete_columns(Gpu)
    gpus = [Gpu.from_db(DEFAULT_DB_ALIAS, gpu_fields, row[width:]) for row in rows if row[width]]
    return node, gpus


@transaction.atomic
def node_heartbeat(
    *,
    node_id: int,
    token_hash: str,
    telemetry: list[dict[str, Any]],
    running: list[dict[str, Any]],
) -> Node | None:
    """Record liveness and the latest telemetry; a lost node that returns is fenced. Only
    while `token_hash` names the node (the agent's token) and the node is not retired: else
    None, and nothing is recorded."""
    now = timezone.now()
    found = _heartbeat_record(node_id, token_hash, now)
    if found is None:
        return None
    node, gpu_list = found
    fenced_changed = False
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
            update_fields=("fenced",),
        )
        fenced_changed = True
    if node.fenced and not running:
        node.fenced = False
        audit_record(actor=None, action="node.unfence", target=node)
        node.save(update_fields=["fenced", "updated_at"])
        fenced_changed = True
    if fenced_changed:
        assignments_changed([node.pk])
    gpus = {g.uuid: g for g in gpu_list}
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
            gpu_health_apply(node, gpu, gpu_health_rules.assess(sample), at=taken, received=now)
    known = [{**s, "gpu_id": gpus[s["uuid"]].pk} for s in telemetry if s.get("uuid") in gpus]
    for sink in ports.TELEMETRY_SINKS:
        sink(node=node, samples=known, now=now)
    return node
