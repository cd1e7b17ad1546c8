"""Quota requests with approval, and the limits a project's owners set for themselves.

An owner asks (`quota_request_create`); operators are e-mailed. An operator approves (the
quota changes in the same transaction) or declines with a reason (nothing changes); the
requester and the project's owners are e-mailed either way. The flow is
`portal.approvals`; this module says only what a quota request asks and what approving it
changes (`QuotaIncrease`). Owners may set a per-member cap on
concurrent GPUs, never above what the project was granted (`quota_owner_limits_set`).
Each write is audited.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from portal.approvals import (
    Applied,
    ApprovalKind,
    approval_approve,
    approval_create,
    approval_decline,
)
from portal.audit import audit_record
from portal.errors import DomainError
from portal.models import Project, Role, User
from portal.services import require_role
from scheduler.models import GpuModel, Quota, QuotaModelLimit, QuotaRequest

MAX_REQUESTED = 100_000


def _positive(value: int | None, field: str) -> int | None:
    if value is None:
        return None
    if not 1 <= value <= MAX_REQUESTED:
        raise DomainError(f"Ask for 1 to {MAX_REQUESTED}.", field=field)
    return value


class QuotaIncrease(ApprovalKind[QuotaRequest]):
    """More concurrent GPUs, GPU-hours a month, or GPUs of one model; approving changes the
    project's quota (its row locked: admissions in flight finish against the old quota,
    later ones see the new)."""

    model = QuotaRequest
    what = "quota request"
    action = "quota.request"
    related = ("project", "requested_by", "gpu_model")
    justification_required = "Say what the quota is for."

    def clean(self, project: Project, asked: dict[str, Any]) -> dict[str, Any]:
        max_gpus = _positive(asked.get("max_gpus"), "max_gpus")
        gpu_hours = _positive(asked.get("gpu_hours_per_month"), "gpu_hours_per_month")
        model_max_gpus = _positive(asked.get("model_max_gpus"), "model_max_gpus")
        gpu_model = asked.get("gpu_model")
        if (gpu_model is None) != (model_max_gpus is None):
            raise DomainError(
                "For a per-model limit give both the GPU model and its number of GPUs.",
                field="model_max_gpus",
            )
        if max_gpus is None and gpu_hours is None and gpu_model is None:
            raise DomainError("Ask for at least one change.", field="max_gpus")
        return {
            "max_gpus": max_gpus,
            "gpu_hours_per_month": gpu_hours,
            "gpu_model": gpu_model,
            "model_max_gpus": model_max_gpus,
        }

    def asks(self, request: QuotaRequest) -> str:
        project = request.project
        return f"asks for a quota change for {project.name} ({project.slug}):\n" + "\n".join(
            f"- {c}" for c in request.changes()
        )

    def told(self, request: QuotaRequest) -> str:
        changes = ", ".join(request.changes())
        return f"Your quota request for {request.project.name} ({changes})"

    def created_data(self, request: QuotaRequest) -> dict[str, Any]:
        return {"changes": request.changes()}

    def decided_data(self, request: QuotaRequest) -> dict[str, Any]:
        return {"changes": request.changes()}

    def apply(self, request: QuotaRequest, *, actor: User) -> Applied:
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
                quota=quota,
                gpu_model=request.gpu_model,
                defaults={"max_gpus": request.model_max_gpus},
            )
        return Applied(data={"before": before})


QUOTA_INCREASE = QuotaIncrease()


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
    return approval_create(
        QUOTA_INCREASE,
        actor=actor,
        project=project,
        justification=justification,
        max_gpus=max_gpus,
        gpu_hours_per_month=gpu_hours_per_month,
        gpu_model=gpu_model,
        model_max_gpus=model_max_gpus,
    )


def quota_request_approve(*, actor: User, request_id: int, reason: str = "") -> QuotaRequest:
    """Apply the request to the project's quota."""
    return approval_approve(QUOTA_INCREASE, actor=actor, request_id=request_id, reason=reason)


def quota_request_decline(*, actor: User, request_id: int, reason: str) -> QuotaRequest:
    """Decline with a reason; the quota is left as it is."""
    return approval_decline(QUOTA_INCREASE, actor=actor, request_id=request_id, reason=reason)


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
