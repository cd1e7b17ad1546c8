"""Asking for a larger storage quota: a kind of request with approval (`portal.approvals`).

An owner asks (`storage_request_create`); operators are e-mailed. An operator approves (the
project's storage quota becomes what was asked, in the same transaction, by
`storage_quota_set`) or declines with a reason (nothing changes); the requester and the
project's owners are told either way. The flow is `portal.approvals`; this module says only
what a storage quota request asks and what approving it changes (`StorageQuotaAsk`). Each
write is audited (`storage.quota.request`, `.approve`, `.decline`).
"""

from __future__ import annotations

from typing import Any

from portal.approvals import (
    Applied,
    ApprovalKind,
    approval_approve,
    approval_create,
    approval_decline,
)
from portal.errors import DomainError
from portal.models import Project, User
from storage.models import StorageQuotaRequest
from storage.services import MAX_QUOTA_GIB, storage_quota_set


class StorageQuotaAsk(ApprovalKind[StorageQuotaRequest]):
    """A project's storage quota of `max_gib`; approving sets it (under the quota's lock)."""

    model = StorageQuotaRequest
    what = "storage quota request"
    action = "storage.quota.request"
    justification_required = "Say what the storage is for."

    def clean(self, project: Project, asked: dict[str, Any]) -> dict[str, Any]:
        max_gib = asked.get("max_gib")
        if not isinstance(max_gib, int) or not 1 <= max_gib <= MAX_QUOTA_GIB:
            raise DomainError(f"Ask for 1 to {MAX_QUOTA_GIB} GiB.", field="max_gib")
        return {"max_gib": max_gib}

    def asks(self, request: StorageQuotaRequest) -> str:
        project = request.project
        return (
            f"asks for a storage quota of {request.max_gib} GiB for {project.name} "
            f"({project.slug})."
        )

    def told(self, request: StorageQuotaRequest) -> str:
        return (
            f"Your request for a storage quota of {request.max_gib} GiB for {request.project.name}"
        )

    def created_data(self, request: StorageQuotaRequest) -> dict[str, Any]:
        return {"max_gib": request.max_gib}

    def decided_data(self, request: StorageQuotaRequest) -> dict[str, Any]:
        return {"max_gib": request.max_gib}

    def apply(self, request: StorageQuotaRequest, *, actor: User) -> Applied:
        quota = storage_quota_set(actor=actor, project=request.project, max_gib=request.max_gib)
        return Applied(data={"quota": quota.pk})


STORAGE_QUOTA = StorageQuotaAsk()


def storage_request_create(
    *, actor: User, project: Project, max_gib: int, justification: str
) -> StorageQuotaRequest:
    """An owner asks for the project's storage quota to become `max_gib`."""
    return approval_create(
        STORAGE_QUOTA, actor=actor, project=project, justification=justification, max_gib=max_gib
    )


def storage_request_approve(
    *, actor: User, request_id: int, reason: str = ""
) -> StorageQuotaRequest:
    """Set the project's storage quota to what was asked."""
    return approval_approve(STORAGE_QUOTA, actor=actor, request_id=request_id, reason=reason)


def storage_request_decline(*, actor: User, request_id: int, reason: str) -> StorageQuotaRequest:
    """Decline with a reason; the storage quota is left as it is."""
    return approval_decline(STORAGE_QUOTA, actor=actor, request_id=request_id, reason=reason)
