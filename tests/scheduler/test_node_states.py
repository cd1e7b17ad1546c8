"""The node state machine: its table, and the one function that applies it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from portal.errors import Conflict
from portal.models import AuditEvent
from scheduler.models import Node, NodeEvent, Pool
from scheduler.nodes.states import NODE_TRANSITIONS, node_can_transition, node_transition

S = Node.State
ROOT = Path(__file__).resolve().parents[2]

# Every move a node makes today, and who makes it.
ALLOWED = {
    (S.PROVISIONING, S.READY),  # its agent registers
    (S.PROVISIONING, S.RETIRED),  # the autoscaler removes it before it came up
    (S.READY, S.READY),  # an operator resets GPU health
    (S.READY, S.CORDONED),
    (S.READY, S.DRAINING),
    (S.READY, S.UNHEALTHY),  # every GPU unhealthy
    (S.READY, S.LOST),  # the loss sweep
    (S.READY, S.RETIRED),  # the autoscaler removes an idle node
    (S.CORDONED, S.READY),  # uncordon, reset health
    (S.CORDONED, S.DRAINING),
    (S.CORDONED, S.LOST),
    (S.CORDONED, S.RETIRED),
    (S.DRAINING, S.READY),  # uncordon
    (S.DRAINING, S.LOST),
    (S.DRAINING, S.RETIRED),
    (S.UNHEALTHY, S.READY),  # reset health
    (S.UNHEALTHY, S.LOST),
    (S.UNHEALTHY, S.RETIRED),
    (S.LOST, S.READY),  # heartbeat (fenced) or registration
    (S.LOST, S.RETIRED),
    # re-registered with other hardware than it registered (from any state it can register in)
    (S.READY, S.QUARANTINED),
    (S.CORDONED, S.QUARANTINED),
    (S.DRAINING, S.QUARANTINED),
    (S.UNHEALTHY, S.QUARANTINED),
    (S.LOST, S.QUARANTINED),  # also a quarantined node that was lost and heartbeats again
    (S.QUARANTINED, S.READY),  # an operator approves the new inventory
    (S.QUARANTINED, S.LOST),  # the loss sweep: it may still run work placed before
    (S.QUARANTINED, S.RETIRED),
}
ALL_MOVES = [(a, b) for a in S.values for b in S.values]


def test_the_table_names_every_state():
    assert set(NODE_TRANSITIONS) == set(S.values)
    assert all(to in S.values for targets in NODE_TRANSITIONS.values() for to in targets)


@pytest.mark.parametrize(("src", "dst"), ALL_MOVES)
def test_allowed_and_refused_moves(src, dst):
    assert node_can_transition(src, dst) == ((src, dst) in ALLOWED)


def test_retired_is_final():
    assert not any(node_can_transition(S.RETIRED, to) for to in S.values)


@pytest.fixture
def node(db):
    pool = Pool.objects.create(name="p")
    return Node.objects.create(
        name="n1", pool=pool, state=S.READY, cpu_milli=1000, memory_mib=1000, agent_token_hash="h"
    )


@pytest.mark.django_db
def test_a_move_writes_the_node_event_and_the_audit_event(node):
    node_transition(node=node, to=S.CORDONED, kind="k", message="why", action="node.cordon")
    node.refresh_from_db()
    assert node.state == S.CORDONED
    event = NodeEvent.objects.get(node=node)
    assert (event.kind, event.message) == ("k", "why")
    audit = AuditEvent.objects.get(action="node.cordon")
    assert audit.data == {"from": S.READY, "to": S.CORDONED}


@pytest.mark.django_db
@pytest.mark.parametrize("dst", [S.PROVISIONING, S.RETIRED])
def test_a_refused_move_changes_nothing(node, dst):
    Node.objects.filter(pk=node.pk).update(state=S.LOST if dst == S.PROVISIONING else S.RETIRED)
    node.refresh_from_db()
    before = node.state
    with pytest.raises(Conflict):
        node_transition(node=node, to=dst if dst != S.RETIRED else S.READY, kind="k", message="m")
    node.refresh_from_db()
    assert node.state == before
    assert not NodeEvent.objects.filter(node=node).exists()
    assert not AuditEvent.objects.exists()


def test_no_node_state_is_written_outside_the_state_machine():
    writes = re.compile(r"\.state = Node\.State\.|update\([^)]*state=Node\.State\.")
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("scheduler", "portal", "billing", "monitoring")
        for p in (ROOT / folder).rglob("*.py")
        if "migrations" not in p.parts and p.name != "states.py" and writes.search(p.read_text())
    ]
    assert offenders == []
