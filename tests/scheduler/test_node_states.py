"""The node state machine: its table, and the one function that applies it."""

from __future__ import annotations

import ast
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


def node_state_writes(source: str) -> list[int]:
    """Lines of a module that write a node's state: `x.state = Node.State.X` (also through an
    alias such as `S = Node.State`, or in a tuple assignment), `node.state = <anything>`,
    `.update(state=Node.State.X)`,
    any `.update(state=...)` on `Node.objects`, and `setattr(x, "state", ...)`. Read from the
    syntax tree, so spacing, line breaks and nested calls cannot hide one. Creating a node in
    its first state is not a move, nor is filtering on a state."""
    tree = ast.parse(source)
    aliases = {"Node.State"}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and ast.unparse(n.value) in aliases:
            aliases |= {ast.unparse(t) for t in n.targets}

    def is_node_state(value: ast.AST | None) -> bool:
        return isinstance(value, ast.Attribute) and ast.unparse(value.value) in aliases

    def named_node(receiver: ast.expr) -> bool:  # node.state = to, self.node.state = ...
        return ast.unparse(receiver).lower().endswith("node")

    def on_nodes(call: ast.Call) -> bool:
        return ast.unparse(call.func).startswith("Node.objects.")

    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign | ast.AnnAssign):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            for target in targets:
                for el in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(el, ast.Attribute) and el.attr == "state":
                        value = n.value
                        if isinstance(value, ast.Tuple) and isinstance(target, ast.Tuple):
                            value = value.elts[target.elts.index(el)]
                        if is_node_state(value) or named_node(el.value):
                            lines.append(n.lineno)
        if isinstance(n, ast.Call):
            method = n.func.attr if isinstance(n.func, ast.Attribute) else None
            if method in ("update", "update_or_create") and any(
                kw.arg == "state" and (is_node_state(kw.value) or on_nodes(n)) for kw in n.keywords
            ):
                lines.append(n.lineno)
            if (
                isinstance(n.func, ast.Name)
                and n.func.id == "setattr"
                and len(n.args) == 3
                and isinstance(n.args[1], ast.Constant)
                and n.args[1].value == "state"
            ):
                lines.append(n.lineno)
    return lines


def test_the_guard_finds_node_state_writes_however_they_are_spelled():
    spelled = [
        "node.state = Node.State.LOST",
        "node.state=Node.State.LOST",
        "S = Node.State\nnode.state = S.LOST",
        "node.state, node.fenced = Node.State.LOST, True",
        "Node.objects.filter(pk=1).update(updated_at=now(), state=Node.State.LOST)",
        "Node.objects.filter(pk=1).update(\n    state='lost',\n)",
        "setattr(node, 'state', 'lost')",
        "node.state = to",
        "self.node.state = new_state",
    ]
    assert [bool(node_state_writes(src)) for src in spelled] == [True] * len(spelled)
    reads = [
        "Node.objects.filter(state=Node.State.LOST)",
        "Node.objects.exclude(state=Node.State.RETIRED)",
        "Node.objects.create(name='n', state=Node.State.PROVISIONING)",
        "job.state = JobState.QUEUED",
        "# node.state = Node.State.LOST",
    ]
    assert [node_state_writes(src) for src in reads] == [[]] * len(reads)


def test_no_node_state_is_written_outside_the_state_machine():
    offenders = [
        f"{p.relative_to(ROOT)}:{line}"
        for folder in ("scheduler", "portal", "billing", "monitoring")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if "migrations" not in p.parts and p.name != "states.py"
        for line in node_state_writes(p.read_text())
    ]
    assert offenders == []
    # the guard sees the one place that may write it
    assert node_state_writes((ROOT / "scheduler/nodes/states.py").read_text())
