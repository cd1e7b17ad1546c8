"""Asking for a larger storage quota, in the request flow every request with approval shares
(`portal.approvals`): an owner asks, operators are e-mailed; an operator approves (the quota
becomes what was asked, in the same transaction) or declines with a reason; the requester and
the project's owners are told either way. Each write is audited.

It plugs into the generic flow by `StorageQuotaRequest` having the fields that flow reads
(`project`, `requested_by`, `status` with "pending", `changes()`) and by deciding through
`request_for_decision` and telling through `tell_requester`.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from portal.approvals import request_for_decision, tell_requester
from portal.audit import audit_record
from portal.errors import DomainError
from portal.mail import send_after_commit
from portal.models import Project, Role, User
from portal.selectors import operator_emails
from portal.services import require_role
from storage.models import StorageQuotaRequest, StorageRequestStatus
from storage.services import MAX_QUOTA_GIB, storage_quota_set


@transaction.atomic
def storage_request_create(
    *, actor: User, project: Project, max_gib: int, justification: str
) -> StorageQuotaRequest:
    """An owner asks for the project's storage quota to become `max_gib`."""
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    if not 1 <= max_gib <= MAX_QUOTA_GIB:
        raise DomainError(f"Ask for 1 to {MAX_QUOTA_GIB} GiB.", field="max_gib")
    justification = justification.strip()
    if not justification:
        raise DomainError("Say what the storage is for.", field="justification")
    request = StorageQuotaRequest.objects.create(
        project=project, requested_by=actor, max_gib=max_gib, justification=justification[:2000]
    )
    audit_record(
        actor=actor,
        action="storage.quota.request",
        target=request,
        project=project,
        data={"max_gib": max_gib},
    )
    send_after_commit(
        subject=f"Storage quota request from {project.name}",
        body=(
            f"{actor.email} asks for a storage quota of {max_gib} GiB for {project.name} "
            f"({project.slug}).\n\nWhy: {request.justification}\n\n"
            "Decide on the storage page of the portal's operations menu."
        ),
        to=operator_emails(),
    )
    return request


def _decidable(request_id: int, actor: User) -> StorageQuotaRequest:
    return request_for_decision(
        StorageQuotaRequest.objects.select_related("project", "requested_by"),
        request_id=request_id,
        actor=actor,
        what="storage quota request",
    )


def _decide(request: StorageQuotaRequest, actor: User, status: str, reason: str) -> None:
    request.status = status
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason.strip()[:2000]
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
    verdict = "approved" if status == StorageRequestStatus.APPROVED else "declined"
    audit_record(
        actor=actor,
        action=f"storage.quota.request.{'approve' if verdict == 'approved' else 'decline'}",
        target=request,
        project=request.project,
        data={"max_gib": request.max_gib, "reason": request.decision_reason},
    )
    tell_requester(
        request,
        subject=f"Storage quota request for {request.project.name} {verdict}",
        body=(
            f"Your request for a storage quota of {request.max_gib} GiB for "
            f"{request.project.name} was {verdict}."
            + (f"\n\nReason: {request.decision_reason}" if request.decision_reason else "")
        ),
    )


@transaction.atomic
def storage_request_approve(
    *, actor: User, request_id: int, reason: str = ""
) -> StorageQuotaRequest:
    request = _decidable(request_id, actor)
    storage_quota_set(actor=actor, project=request.project, max_gib=request.max_gib)
    _decide(request, actor, StorageRequestStatus.APPROVED, reason)
    return request


@transaction.atomic
def storage_request_decline(*, actor: User, request_id: int, reason: str) -> StorageQuotaRequest:
    request = _decidable(request_id, actor)
    if not reason.strip():
        raise DomainError("Say why the request is declined.", field="reason")
    _decide(request, actor, StorageRequestStatus.DECLINED, reason)
    return request
