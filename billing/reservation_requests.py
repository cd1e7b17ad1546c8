"""Reserved plans by request: an owner asks, an operator approves or declines with a reason.

Approving creates the plan with `reserved_plan_create` on the project's billing account,
starting now: its monthly fee comes from the price in effect at the start, and the scheduler
guarantees the GPUs from then on, as for any reserved plan. The requester and the project's
owners are e-mailed either way; operators are e-mailed when a request arrives. Audited.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from billing import pricing
from billing.models import ReservationRequest
from billing.services import account_open_for_project, reserved_plan_create
from portal.approvals import request_for_decision, tell_requester
from portal.audit import audit_record
from portal.errors import DomainError
from portal.mail import send_after_commit
from portal.models import Project, Role, User
from portal.selectors import operator_emails
from portal.services import require_role
from scheduler.models import GpuModel


@transaction.atomic
def reservation_request_create(
    *,
    actor: User,
    project: Project,
    gpu_model: GpuModel,
    gpus: int,
    term_months: int,
    justification: str = "",
) -> ReservationRequest:
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    if term_months not in pricing.RESERVED_TERMS_MONTHS:
        terms = ", ".join(str(t) for t in pricing.RESERVED_TERMS_MONTHS)
        raise DomainError(f"A reservation term is {terms} months.", field="term_months")
    if not 1 <= gpus <= 4096:
        raise DomainError("Reserve 1 to 4096 GPUs.", field="gpus")
    request = ReservationRequest.objects.create(
        project=project,
        requested_by=actor,
        gpu_model=gpu_model,
        gpus=gpus,
        term_months=term_months,
        justification=justification.strip()[:2000],
    )
    audit_record(
        actor=actor,
        action="billing.reserved.request",
        target=request,
        project=project,
        data={"gpus": gpus, "model": gpu_model.name, "term": term_months},
    )
    send_after_commit(
        subject=f"Reservation request from {project.name}",
        body=(
            f"{actor.email} asks to reserve {request.summary()} for {project.name} "
            f"({project.slug}).\n\nWhy: {request.justification or '-'}\n\n"
            "Decide on the requests page of the portal."
        ),
        to=operator_emails(),
    )
    return request


def _decidable(request_id: int, actor: User) -> ReservationRequest:
    return request_for_decision(
        ReservationRequest.objects.select_related("project", "requested_by", "gpu_model"),
        request_id=request_id,
        actor=actor,
        what="reservation request",
    )


def _tell(request: ReservationRequest, verdict: str, detail: str) -> None:
    tell_requester(
        request,
        subject=f"Reservation request for {request.project.name} {verdict}",
        body=f"Your request to reserve {request.summary()} was {verdict}.{detail}",
    )


@transaction.atomic
def reservation_request_approve(
    *, actor: User, request_id: int, reason: str = ""
) -> ReservationRequest:
    request = _decidable(request_id, actor)
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
    request.status = ReservationRequest.Status.APPROVED
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason.strip()[:2000]
    request.plan = plan
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_reason", "plan"])
    audit_record(
        actor=actor,
        action="billing.reserved.request.approve",
        target=request,
        project=request.project,
        data={"plan": plan.pk, "reason": request.decision_reason},
    )
    _tell(
        request,
        "approved",
        f"\n\nThe plan runs from {plan.starts_at:%Y-%m-%d} to {plan.ends_at:%Y-%m-%d} at "
        f"{plan.monthly_fee} {account.currency} a month."
        + (f"\n\nNote: {request.decision_reason}" if request.decision_reason else ""),
    )
    return request


@transaction.atomic
def reservation_request_decline(*, actor: User, request_id: int, reason: str) -> ReservationRequest:
    reason = reason.strip()
    if not reason:
        raise DomainError("Say why the request is declined.", field="reason")
    request = _decidable(request_id, actor)
    request.status = ReservationRequest.Status.DECLINED
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_reason = reason[:2000]
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
    audit_record(
        actor=actor,
        action="billing.reserved.request.decline",
        target=request,
        project=request.project,
        data={"reason": request.decision_reason},
    )
    _tell(request, "declined", f"\n\nReason: {request.decision_reason}")
    return request
