"""Requests with approval: one flow, and each kind of request plugs into it what differs.

The flow (`approval_create`, `approval_approve`, `approval_decline`): a project's owner asks
and operators are e-mailed; an operator takes the pending request under its row lock and
approves it (the kind applies it in the same transaction) or declines it with a reason
(nothing changes); the requester and the project's owners are told the verdict either way;
each step is audited (`<kind.action>`, `.approve`, `.decline`).

A kind (`ApprovalKind`) says only what is asked and what approval applies: its model, its
words, how it checks what is asked (`clean`) and what approving does (`apply`). The quota
increase (`scheduler.quota_requests`), the reserved plan (`billing.reservation_requests`)
and the storage quota (`storage.quota_requests`) are the kinds today; a new one is a subclass, a model with the common columns (project,
requested_by, justification, status, decided_by, decided_at, decision_reason) and three
one-line services. The pages' two POST handlers are shared too (`ask_from_post`,
`decide_from_post`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

from django.contrib import messages
from django.db import transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError, NotFound, PermissionDenied
from portal.forms import errors_in_words
from portal.mail import send_after_commit
from portal.models import NoticeKind, Project, Role, User
from portal.notify import notify
from portal.selectors import operator_emails, project_owner_emails
from portal.services import require_role

M = TypeVar("M", bound=Model)
PENDING = "pending"  # the status value every request model uses for "not decided yet"
APPROVED, DECLINED = "approved", "declined"
MAX_TEXT = 2000  # a justification or a decision's reason is kept up to this many characters


@dataclass(frozen=True)
class Applied:
    """What approving did, for the audit event and the requester's message."""

    data: dict[str, Any] = field(default_factory=dict)  # added to the audit event's data
    fields: tuple[str, ...] = ()  # request columns `apply` set, saved with the decision
    told: str = ""  # said to the requester after "was approved."


class ApprovalKind(Generic[M]):
    """One kind of request with approval: what differs from kind to kind."""

    model: ClassVar[type[Model]]
    what: ClassVar[str]  # "quota request": in errors, e-mail subjects and messages
    action: ClassVar[str]  # the audit action of the request; its decisions add .approve/.decline
    related: ClassVar[tuple[str, ...]] = ("project", "requested_by")
    # None: a justification is optional; else the error when it is missing
    justification_required: ClassVar[str | None] = None
    approval_note: ClassVar[str] = "Reason"  # how an approval's reason is introduced

    def clean(self, project: Project, asked: dict[str, Any]) -> dict[str, Any]:
        """What is asked, checked (DomainError naming the field): the request's columns."""
        return asked

    def asks(self, request: M) -> str:
        """What is asked, for the operators' e-mail: the words after the requester's address."""
        raise NotImplementedError

    def told(self, request: M) -> str:
        """What was asked, for the requester's message: "Your ... " (before "was <verdict>")."""
        raise NotImplementedError

    def created_data(self, request: M) -> dict[str, Any]:
        """The audit data of the request's creation."""
        return {}

    def decided_data(self, request: M) -> dict[str, Any]:
        """Audit data every decision carries besides the reason."""
        return {}

    def apply(self, request: M, *, actor: User) -> Applied:
        """Approve: make the change, in the decision's transaction."""
        raise NotImplementedError

    def requests(self) -> QuerySet[M]:
        return cast("QuerySet[M]", self.model._default_manager.select_related(*self.related))

    @property
    def title(self) -> str:
        return self.what[:1].upper() + self.what[1:]


@transaction.atomic
def approval_create(
    kind: ApprovalKind[M], *, actor: User, project: Project, justification: str, **asked: Any
) -> M:
    """An owner asks; the operators are e-mailed after the commit."""
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    columns = kind.clean(project, asked)
    justification = justification.strip()
    if not justification and kind.justification_required:
        raise DomainError(kind.justification_required, field="justification")
    justification = justification[:MAX_TEXT]
    request = cast(
        M,
        kind.model._default_manager.create(
            project=project, requested_by=actor, justification=justification, **columns
        ),
    )
    audit_record(
        actor=actor,
        action=kind.action,
        target=request,
        project=project,
        data=kind.created_data(request),
    )
    send_after_commit(
        subject=f"{kind.title} from {project.name}",
        body=(
            f"{actor.email} {kind.asks(request)}\n\n"
            f"Why: {justification or '-'}\n\n"
            "Decide on the requests page of the portal."
        ),
        to=operator_emails(),
    )
    return request


def request_for_decision(requests: QuerySet[M], *, request_id: int, actor: User, what: str) -> M:
    """The pending request `request_id`, locked until the decision commits; only operators
    decide, and a request is decided once."""
    if not actor.is_staff:
        raise PermissionDenied(f"Only operators decide {what}s.")
    request = requests.select_for_update(of=("self",)).filter(pk=request_id).first()
    if request is None:
        raise NotFound(f"No such {what}.")
    status: str = getattr(request, "status")  # noqa: B009 - every request model has one
    if status != PENDING:
        raise Conflict(f"This request was already {status}.")
    return request


def _decided(
    kind: ApprovalKind[M],
    request: M,
    *,
    actor: User,
    status: str,
    reason: str,
    applied: Applied,
    detail: str,
) -> M:
    setattr(request, "status", status)  # noqa: B010 - the common columns of every kind
    setattr(request, "decided_by", actor)  # noqa: B010
    setattr(request, "decided_at", timezone.now())  # noqa: B010
    setattr(request, "decision_reason", reason[:MAX_TEXT])  # noqa: B010
    request.save(
        update_fields=["status", "decided_by", "decided_at", "decision_reason", *applied.fields]
    )
    verdict = "approve" if status == APPROVED else "decline"
    project = getattr(request, "project")  # noqa: B009
    audit_record(
        actor=actor,
        action=f"{kind.action}.{verdict}",
        target=request,
        project=project,
        data={**kind.decided_data(request), **applied.data, "reason": reason[:MAX_TEXT]},
    )
    tell_requester(
        request,
        subject=f"{kind.title} for {project.name} {status}",
        body=f"{kind.told(request)} was {status}.{detail}",
    )
    return request


@transaction.atomic
def approval_approve(kind: ApprovalKind[M], *, actor: User, request_id: int, reason: str = "") -> M:
    """An operator approves: the kind applies the request in this transaction."""
    request = request_for_decision(
        kind.requests(), request_id=request_id, actor=actor, what=kind.what
    )
    reason = reason.strip()
    applied = kind.apply(request, actor=actor)
    note = f"\n\n{kind.approval_note}: {reason[:MAX_TEXT]}" if reason else ""
    return _decided(
        kind,
        request,
        actor=actor,
        status=APPROVED,
        reason=reason,
        applied=applied,
        detail=applied.told + note,
    )


@transaction.atomic
def approval_decline(kind: ApprovalKind[M], *, actor: User, request_id: int, reason: str) -> M:
    """An operator declines with a reason; nothing else changes."""
    reason = reason.strip()
    if not reason:
        raise DomainError("Say why the request is declined.", field="reason")
    request = request_for_decision(
        kind.requests(), request_id=request_id, actor=actor, what=kind.what
    )
    return _decided(
        kind,
        request,
        actor=actor,
        status=DECLINED,
        reason=reason,
        applied=Applied(),
        detail=f"\n\nReason: {reason[:MAX_TEXT]}",
    )


def tell_requester(request: Any, *, subject: str, body: str) -> None:
    """Tell the project's owners and whoever asked (once each, by e-mail unless they turned
    this kind off) and the project's webhook, after the commit."""
    to = sorted(
        {*project_owner_emails(project=request.project), getattr(request.requested_by, "email", "")}
        - {""}
    )
    notify(
        kind=NoticeKind.REQUEST_DECIDED,
        project=request.project,
        subject=subject,
        message=body,
        to=to,
        data={
            "request": type(request).__name__,
            "id": request.pk,
            "status": getattr(request, "status", ""),
        },
    )


# ---- the pages' POST handlers (the project's requests page, the operators' queue) ----------


def ask_from_post(
    request: HttpRequest,
    *,
    project: Project,
    form: Any,
    create: Callable[..., Any],
    sent: str,
) -> HttpResponse:
    """An owner's request from a form: sent (`create`) or the error said; back to the
    project's requests page either way."""
    if not form.is_valid():
        messages.error(request, f"The request was not sent: {errors_in_words(form)}")
        return redirect("project-requests", slug=project.slug)
    try:
        create(actor=request.user, project=project, **form.cleaned_data)
        messages.success(request, sent)
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("project-requests", slug=project.slug)


def decide_from_post(
    request: HttpRequest,
    *,
    request_id: int,
    form: Any,
    approve: Callable[..., Any],
    decline: Callable[..., Any],
    approved: str,
) -> HttpResponse:
    """An operator's decision from a form (`decision`: approve or decline, `reason`); back to
    the operators' queue."""
    if not form.is_valid():
        messages.error(request, "Choose approve or decline.")
        return redirect("request-queue")
    decide = approve if form.cleaned_data["decision"] == "approve" else decline
    try:
        decide(actor=request.user, request_id=request_id, reason=form.cleaned_data["reason"])
        messages.success(request, approved if decide is approve else "Declined.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("request-queue")
