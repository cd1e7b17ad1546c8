"""What every request with approval shares (a quota increase, a reserved plan): an operator
takes a pending one under its row lock to decide it, and the project's owners and the
requester are told the verdict."""

from __future__ import annotations

from typing import Any, TypeVar

from django.db.models import Model, QuerySet

from portal.errors import Conflict, NotFound, PermissionDenied
from portal.models import NoticeKind, User
from portal.notify import notify
from portal.selectors import project_owner_emails

M = TypeVar("M", bound=Model)
PENDING = "pending"  # the status value every request model uses for "not decided yet"


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
