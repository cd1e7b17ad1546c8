"""The node state machine: one function performs every transition, checked against one table.

Every transition writes a NodeEvent and an audit event in the same transaction, the node's
counterpart of `scheduler.transitions` for jobs. Which operator action may start from which
state is `scheduler.nodes.operator`'s narrower table; this one says what a node may ever do.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from portal.audit import audit_record
from portal.errors import Conflict
from portal.models import User
from scheduler.models import Node, NodeEvent
from scheduler.nodes.tokens import agent_token_forget

S = Node.State

NODE_TRANSITIONS: dict[str, frozenset[str]] = {
    # registered by its agent, or removed by the autoscaler before it came up
    S.PROVISIONING: frozenset({S.READY, S.RETIRED}),
    # READY → READY: an operator resets the GPUs' health of a node that stayed ready
    S.READY: frozenset(
        {S.READY, S.CORDONED, S.DRAINING, S.UNHEALTHY, S.LOST, S.QUARANTINED, S.RETIRED}
    ),
    S.CORDONED: frozenset({S.READY, S.DRAINING, S.LOST, S.QUARANTINED, S.RETIRED}),
    S.DRAINING: frozenset({S.READY, S.LOST, S.QUARANTINED, S.RETIRED}),
    S.UNHEALTHY: frozenset({S.READY, S.LOST, S.QUARANTINED, S.RETIRED}),
    # READY: it came back (fenced) or re-registered; QUARANTINED: with other hardware
    S.LOST: frozenset({S.READY, S.QUARANTINED, S.RETIRED}),
    # re-registered with other hardware than it registered: READY only when an operator
    # approves the new inventory; nothing is placed on it meanwhile
    S.QUARANTINED: frozenset({S.READY, S.LOST, S.RETIRED}),
    S.RETIRED: frozenset(),
}


def node_can_transition(from_state: str, to_state: str) -> bool:
    return to_state in NODE_TRANSITIONS.get(from_state, frozenset())


@transaction.atomic
def node_transition(
    *,
    node: Node,
    to: str,
    kind: str,
    message: str,
    severity: str = NodeEvent.Severity.INFO,
    actor: User | None = None,
    action: str | None = None,
    data: dict[str, Any] | None = None,
    remote_addr: str | None = None,
    update_fields: tuple[str, ...] = (),
) -> Node:
    """Move `node` (locked by the caller, or locked here) to state `to`, or raise Conflict.

    Writes the NodeEvent (`kind`, `message`, `severity`) and the audit event (`action`, by
    default `node.<to>`; `data`, by default the move). Extra attributes the caller set on
    `node` are saved when named in `update_fields`. A retired node's token stops working.
    """
    current = Node.objects.select_for_update().values_list("state", flat=True).get(pk=node.pk)
    if not node_can_transition(current, to):
        raise Conflict(
            f"Node {node.name} is {current}; it cannot become {to}.", code="invalid_transition"
        )
    node.state = to
    node.save(update_fields=sorted({"state", "updated_at", *update_fields}))
    if to == S.RETIRED and node.agent_token_hash:
        retired_hash = node.agent_token_hash
        transaction.on_commit(lambda: agent_token_forget(retired_hash))
    NodeEvent.objects.create(node=node, severity=severity, kind=kind, message=message[:500])
    audit_record(
        actor=actor,
        action=action or f"node.{to}",
        target=node,
        data={"from": current, "to": to} if data is None else data,
        remote_addr=remote_addr,
    )
    return node
