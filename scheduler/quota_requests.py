"""Quota requests with approval, and the limits a project's owners set for themselves.

An owner asks (`quota_request_create`); operators are e-mailed. An operator approves (the
quota changes in the same transaction) or declines with a reason (nothing changes); the
requester and the project's owners are e-mailed either way. Owners may set a per-member cap on
concurrent GPUs, never above what the project was granted (`quota_owner_limits_set`).
Each write is audited.
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
from scheduler.models import GpuModel, Quota, QuotaModelLimit, QuotaRequest, RequestStatus

MAX_REQUESTED = 100_000


def _positive(value: int | None, field: str) -> int | None:
    if value is None:
        return None
    if not 1 <= value <= MAX_REQUESTED:
        raise DomainError(f"Ask for 1 to {MAX_REQUESTED}.", field=field)
    return value


@transaction.atomic
def quota_request_create(
    *,
    actor: User,
    project: Project,
    justification: str,
    max_gpus: int | None = None,
    gpu_hours_per_month: int | None = None,
    gpu_model: GpuModel | None = None,
    model_max_gpus: int | None = None,
) -> QuotaRequest:
    """An owner asks operators for more quota."""
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    max_gpus = _positive(max_gpus, "max_gpus")
    gpu_hours_per_month = _positive(gpu_hours_per_month, "gpu_hours_per_month")
    model_max_gpus = _positive(model_max_gpus, "model_max_gpus")
    if (gpu_model is None) != (model_max_gpus is None):
        raise DomainError(
            "For a per-model limit give both the GPU model and its number of GPUs.",
            field="model_max_gpus",
        )
    if max_gpus is None and gpu_hours_per_month is None and gpu_model is None:
        raise DomainError("Ask for at least one change.", field="max_gpus")
    justification = justification.strip()
    if not justification:
        raise DomainError("Say what the quota is for.", field="justification")
    request = QuotaRequest.objects.create(
        project=project,
        requested_by=actor,
        max_gpus=max_gpus,
        gpu_hours_per_month=gpu_hours_per_month,
        gpu_model=gpu_model,
        model_max_gpus=model_max_gpus,
        justification=justification[:2000],
    )
    audit_record(
        actor=actor,
        action="quota.request",
        target=request,
        project=project,
        data={"changes": request.changes()},
    )
    send_after_commit(
        subject=f"Quota request from {project.name}",
        body=(
            f"{actor.email} asks for a quota change for {project.name} ({project.slug}):\n"
            + "\n".join(f"- {c}" for c in request.changes())
            + f"\n\nWhy: {request.justification}\n\nDecide on the requests page of the portal."
        ),
        to=operator_emails(),
    )
    return request


def _decidable(request_id: int, actor: User) -> QuotaRequest:
    return request_for_decision(
        QuotaRequest.objects.select_related("project", "requested_by", "gpu_model"),
        request_id=request_id,
        actor=actor,
        what="quota request",
    )


def _tell(request: QuotaRequest, verdict: str, reason: str) -> None:
    tell_requester(
        request,
        subject=f"Quota request for {request.project.name} {verdict}",
        body=(
            f"Your quota request for {request.project.name} ("
            + ", ".join(request.changes())
            + f") was {verdict}."
            + (f"\n\nReason: {reason}" if reason else "")
        ),
    )


@transaction.atomic
def quota_request_approve(*, actor: User, request_id: int, reason: str = "") -> QuotaRequest:
    """Apply the request to the project's quota (the row locked: admissions in flight finish
    against the old quota, later ones see the new)."""
    request = _decidable(request_id, actor)
    quota = Quota.objects.select_for_update().get(project=request.project)
    before = {"max_gpus": quota.max_gpus, "gpu_hours_per_month": quota.gpu_hours_per_month}
    fields = ["updated_at"]
    if request.max_gpus is not None:
        quota.max_gpus = request.max_gpus
        fields.append("max_gpus")
        if quota.max_gpus_per_member is not None and quota.max_gpus_per_member > quota.max_gpus:
            quota.max_gpus_per_member = quota.max_gpus
            fields.append("max_gpus_per_member")
    if request.gpu_hours_per_month is not None:
        quota.gpu_hours_per_month = request.gpu_hours_per_month
        fields.append("gpu_hours_per_month")
    quota.save(update_fields=fields)
    if request.gpu_model is not None and request.model_max_gpus is not None:
        QuotaModelLimit.objects.update_or_create(
            quota=quota, gpu_model=request.gpu_model, defaults={"max_gpus": request.model_max_gpus}
        )
    request.status = RequestStatus.APPROVED
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason.strip()[:2000]
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
    audit_record(
        actor=actor,
        action="quota.request.approve",
        target=request,
        project=request.project,
        data={"changes": request.changes(), "before": before, "reason": request.decision_reason},
    )
    _tell(request, "approved", request.decision_reason)
    return request


@transaction.atomic
def quota_request_decline(*, actor: User, request_id: int, reason: str) -> QuotaRequest:
    """Decline with a reason; the quota is left as it is."""
    reason = reason.strip()
    if not reason:
        raise DomainError("Say why the request is declined.", field="reason")
    request = _decidable(request_id, actor)
    request.status = RequestStatus.DECLINED
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason[:2000]
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
    audit_record(
        actor=actor,
        action="quota.request.decline",
        target=request,
        project=request.project,
        data={"changes": request.changes(), "reason": request.decision_reason},
    )
    _tell(request, "declined", request.decision_reason)
    return request


@transaction.atomic
def quota_owner_limits_set(
    *, actor: User, project: Project, max_gpus_per_member: int | None
) -> Quota:
    """Owners cap what one member may hold at once, within what the project was granted."""
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    quota = Quota.objects.select_for_update().get(project=project)
    if max_gpus_per_member is not None:
        if max_gpus_per_member < 1:
            raise DomainError("A per-member cap is at least 1 GPU.", field="max_gpus_per_member")
        if quota.max_gpus is not None and max_gpus_per_member > quota.max_gpus:
            raise DomainError(
                f"{project.name} was granted {quota.max_gpus} concurrent GPUs; a member's cap "
                "cannot be higher. Ask for more quota first.",
                field="max_gpus_per_member",
            )
        if max_gpus_per_member > MAX_REQUESTED:
            raise DomainError(f"At most {MAX_REQUESTED}.", field="max_gpus_per_member")
    old = quota.max_gpus_per_member
    quota.max_gpus_per_member = max_gpus_per_member
    quota.save(update_fields=["max_gpus_per_member", "updated_at"])
    audit_record(
        actor=actor,
        action="quota.owner_limits",
        target=quota,
        project=project,
        data={"max_gpus_per_member": {"from": old, "to": max_gpus_per_member}},
    )
    return quota
