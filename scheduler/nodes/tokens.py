"""Agent tokens: issue one per node (hashed at rest), and find a node by its token, cached.

Fast path: finding the node behind a token is a compiled query building the Node from its row,
asked by every agent request that touches its node's data; measured by `bench.agent_requests`
and `bench.submit_throughput`.
"""

from __future__ import annotations

import hashlib
import secrets

from django.core.cache import cache
from django.db import transaction

from foundation.db import CompiledQuery, concrete_columns, instance_from_row
from portal.audit import audit_record
from portal.models import User
from scheduler.models import Node

AGENT_TOKEN_PREFIX = "gpn_"


def agent_token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


AGENT_TOKEN_TTL_S = 30  # how long a token's node is remembered in the cache


def agent_token_key(token_hash: str) -> str:
    """The cache key remembering which node a token hash names."""
    return f"scheduler:agent-token:{token_hash}"


def agent_token_forget(token_hash: str) -> None:
    """The cache stops vouching for this token hash (issued anew, node retired)."""
    if token_hash:
        cache.delete(agent_token_key(token_hash))


@transaction.atomic
def node_issue_agent_token(*, node: Node, actor: User | None = None) -> str:
    """A new agent token for the node (the old one stops working). Shown once."""
    raw = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    old = Node.objects.filter(pk=node.pk).values_list("agent_token_hash", flat=True).first()
    Node.objects.filter(pk=node.pk).update(agent_token_hash=agent_token_hash(raw))
    node.agent_token_hash = agent_token_hash(raw)
    if old:
        transaction.on_commit(lambda: agent_token_forget(old))
    audit_record(actor=actor, action="node.token_issue", target=node)
    return raw


# Compiled once (`CompiledQuery`): every agent request that touches its node's data asks.
# The rows are whole Node rows (`concrete_columns`), named by becoming a Node instance.
_NODE_BY_TOKEN = CompiledQuery(
    lambda token_hash: (
        Node.objects.filter(agent_token_hash=token_hash)
        .exclude(state=Node.State.RETIRED)
        .order_by("pk")
        .values_list(*concrete_columns(Node))[:1]
    )
)
_NODE_BY_TOKEN_AND_ID = CompiledQuery(
    lambda token_hash, node_id: (
        Node.objects.filter(agent_token_hash=token_hash, pk=node_id)
        .exclude(state=Node.State.RETIRED)
        .values_list(*concrete_columns(Node))[:1]
    )
)


def node_for_agent_token_hash(token_hash: str, node_id: int | None = None) -> Node | None:
    """The node this token hash belongs to, read from the database (not retired)."""
    rows = (
        _NODE_BY_TOKEN.rows(token_hash=token_hash)
        if node_id is None
        else _NODE_BY_TOKEN_AND_ID.rows(token_hash=token_hash, node_id=node_id)
    )
    return instance_from_row(Node, rows[0]) if rows else None


def node_id_for_agent_token(raw: str) -> tuple[int, str] | None:
    """(node id, token hash) for an agent token, remembered in the cache for a few seconds.

    Only the id comes from the cache: whoever needs the node loads it with
    `node_for_agent_token_hash(hash, node_id)`, which checks the token again in the database.
    """
    if not raw.startswith(AGENT_TOKEN_PREFIX) or len(raw) > 200:
        return None
    token_hash = agent_token_hash(raw)
    key = agent_token_key(token_hash)
    node_id = cache.get(key)
    if not isinstance(node_id, int):
        node = node_for_agent_token_hash(token_hash)
        if node is None:
            return None
        node_id = node.pk
        cache.set(key, node_id, timeout=AGENT_TOKEN_TTL_S)
    return node_id, token_hash
