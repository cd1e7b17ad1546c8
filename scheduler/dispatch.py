"""Per-node assignment versions in the cache, so that an agent's poll that finds nothing new
costs no SQL.

A version names one state of a node's assignments (`nodes.assignments_for`). Every write that
changes what a node must run or stop calls `assignments_changed(node_ids)` inside its
transaction; after the commit those nodes' versions are dropped, and the next full read mints a
new one *before* it reads the database, so a change that commits in between is never hidden
behind the version it answers with. A missed call heals on its own: a version lives at most
VERSION_TTL_S.

Agents that watch (`/events/agent`, web/events.py) hear of each change as it commits and sync
then; their polls become a slow fallback.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from django.core.cache import cache
from django.db import transaction

from foundation import push
from scheduler.models import ACTIVE_STATES, JobState

VERSION_TTL_S = 30
_HOLDS_GPUS = frozenset(ACTIVE_STATES)


def version_key(node_id: int | str) -> str:
    """The cache key of the node's assignment version (a str id: a template, see agent_api.gate)."""
    return f"scheduler:assignments:{node_id}"


def changes_assignments(from_state: str, to_state: str) -> bool:
    """Whether a job moving between these states changes what its nodes run or stop."""
    return (from_state in _HOLDS_GPUS) != (to_state in _HOLDS_GPUS) or (
        from_state == JobState.PREEMPTING
    ) != (to_state == JobState.PREEMPTING)


def assignments_changed(node_ids: Iterable[int]) -> None:
    """Drop these nodes' versions once the current transaction commits (at once outside one),
    then tell their agents' watches (`foundation.push`), which sync at once: the version is gone
    before they hear of it, so their sync reads the change."""
    ids = sorted(set(node_ids))
    if ids:
        keys = [version_key(pk) for pk in ids]
        transaction.on_commit(lambda: cache.delete_many(keys))
        push.assignments_changed(ids)


def assignments_version(node_id: int) -> str | None:
    """The node's current version, or None when there is none (changed, or expired)."""
    version = cache.get(version_key(node_id))
    return version if isinstance(version, str) else None


def assignments_version_mint(node_id: int) -> str:
    """The version to answer a full read with. Call it before reading the assignments."""
    version = secrets.token_hex(8)
    if cache.add(version_key(node_id), version, timeout=VERSION_TTL_S):
        return version
    return assignments_version(node_id) or version
