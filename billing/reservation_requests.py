"""Reserved plans by request: an owner asks, an operator approves or declines with a reason.

Approving creates the plan with `reserved_plan_create` on the project's billing account,
starting now: its monthly fee comes from the price in effect at the start, and the scheduler
guarantees the GPUs from then on, as for any reserved plan. The requester and the project's
owners are e-mailed either way; operators are e-mailed when a request arrives. Audited. The
flow is `portal.approvals`; this module says only what is asked and what approval applies
(`ReservedPlanAsk`).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from billing import pricing
from billing.models import ReservationRequest
from billing.services import account_open_for_project, reserved_plan_create
from portal.approvals import (
    Applied,
    ApprovalKind,
    approval_approve,
    approval_create,
    approval_decline,
)
from portal.errors import DomainError
from portal.models import Project, User
from scheduler.models import GpuModel


class ReservedPlanAsk(ApprovalKind[ReservationRequest]):
    """N GPUs of a model for a term; approving creates the reserved plan, starting now."""

    model = ReservationRequest
    what = "reservation request"
    action = "billing.reserved.request"
    related = ("project", "requested_by", "gpu_model")
    approval_note = "Note"

    def clean(self, project: Project, asked: dict[str, Any]) -> dict[str, Any]:
        if asked["term_months"] not in pricing.RESERVED_TERMS_MONTHS:
            terms = ", ".join(str(t) for t in pricing.RESERVED_TERMS_MONTHS)
            raise DomainError(f"A reservation term is {terms} months.", field="term_months")
        if not 1 <= asked["gpus"] <= 4096:
            raise DomainError("Reserve 1 to 4096 GPUs.", field="gpus")
        return asked

    def asks(self, request: ReservationRequest) -> str:
        project = request.project
        return f"asks to reserve {request.summary()} for {project.name} ({project.slug})."

    def told(self, request: ReservationRequest) -> str:
        return f"Your request to reserve {request.summary()}"

    def created_data(self, request: ReservationRequest) -> dict[str, Any]:
        return {"gpus": request.gpus, "model": request.gpu_model.name, "term": request.term_months}

    def apply(self, request: ReservationRequest, *, actor: User) -> Applied:
        account = account_open_for_project(project=request.project, actor=actor)
        plan = reserved_plan_create(
            actor=actor,
            account=account,
            gpu_model=request.gpu_model,
            gpus=request.gpus,
            term_months=request.term_months,
            starts_at=timezone.now(),
            project=request.project,
        )
        request.plan = plan
        return Applied(
            data={"plan": plan.pk},
            fields=("plan",),
            told=f"\n\nThe plan runs from {plan.starts_at:%Y-%m-%d} to {plan.ends_at:%Y-%m-%d} "
            f"at {plan.monthly_fee} {account.currency} a month.",
        )


RESERVED_PLAN = ReservedPlanAsk()


def reservation_request_create(
    *,
    actor: User,
    project: Project,
    gpu_model: GpuModel,
    gpus: int,
    term_months: int,
    justification: str = "",
) -> ReservationRequest:
    return approval_create(
        RESERVED_PLAN,
        actor=actor,
        project=project,
        justification=justification,
        gpu_model=gpu_model,
        gpus=gpus,
        term_months=term_months,
    )


def reservation_request_approve(
    *, actor: User, request_id: int, reason: str = ""
) -> ReservationRequest:
    return approval_approve(RESERVED_PLAN, actor=actor, request_id=request_id, reason=reason)


def reservation_request_decline(*, actor: User, request_id: int, reason: str) -> ReservationRequest:
    return approval_decline(RESERVED_PLAN, actor=actor, request_id=request_id, reason=reason)
