"""Audit trail: one event for every state change, written in the caller's transaction."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from django.db import models

from foundation.db import insert_instances
from portal.models import AuditEvent, Project, User

# The client address of the request being served, so every audit event says "from where".
request_remote_addr: ContextVar[str | None] = ContextVar("request_remote_addr", default=None)


def audit_record(
    *,
    actor: User | None,
    action: str,
    target: models.Model | None = None,
    project: Project | None = None,
    data: dict[str, Any] | None = None,
    remote_addr: str | None = None,
) -> AuditEvent:
    event = audit_event(
        actor=actor,
        action=action,
        target=target,
        project=project,
        data=data,
        remote_addr=remote_addr,
    )
    insert_instances([event])  # every state change writes one: SQL built once
    return event


def audit_event(
    *,
    actor: User | None,
    action: str,
    target: models.Model | None = None,
    project: Project | None = None,
    data: dict[str, Any] | None = None,
    remote_addr: str | None = None,
) -> AuditEvent:
    """The audit event `audit_record` writes, unsaved: for a caller that writes it in the
    statement of its own rows (`insert_instances` with several groups), in its transaction."""
    return AuditEvent(
        actor=actor if actor is not None and actor.pk else None,
        actor_label=str(actor) if actor is not None else "system",
        action=action,
        project=project,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        data=data or {},
        remote_addr=remote_addr or request_remote_addr.get(),
    )
