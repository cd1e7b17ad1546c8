"""The one approval flow, driven through a kind made up here: a kind says only what is asked
and what approving applies; asking, deciding once under the lock, the audit trail and telling
both sides come from the flow."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail

from portal.approvals import (
    Applied,
    ApprovalKind,
    approval_approve,
    approval_create,
    approval_decline,
)
from portal.errors import Conflict, DomainError, PermissionDenied
from portal.models import AuditEvent
from scheduler.models import QuotaRequest

pytestmark = pytest.mark.django_db


class Probe(ApprovalKind[QuotaRequest]):
    """A third kind, as small as one gets (it borrows the quota request's table)."""

    model = QuotaRequest
    what = "probe request"
    action = "probe.request"

    def __init__(self) -> None:
        self.applied: list[int] = []

    def clean(self, project: Any, asked: dict[str, Any]) -> dict[str, Any]:
        if not asked.get("max_gpus"):
            raise DomainError("Ask for GPUs.", field="max_gpus")
        return asked

    def asks(self, request: QuotaRequest) -> str:
        return f"asks for {request.max_gpus} probes."

    def told(self, request: QuotaRequest) -> str:
        return f"Your probe request for {request.max_gpus}"

    def apply(self, request: QuotaRequest, *, actor: Any) -> Applied:
        self.applied.append(request.pk)
        return Applied(data={"probed": True}, told=" Probed.")


@pytest.fixture
def operator(make_user):
    return make_user("ops@example.org", staff=True)


def test_a_new_kind_gets_the_whole_flow(team, operator, django_capture_on_commit_callbacks):
    kind = Probe()
    with pytest.raises(PermissionDenied):
        approval_create(kind, actor=team["member"], project=team["a"], justification="", max_gpus=2)
    with pytest.raises(DomainError) as bad:
        approval_create(kind, actor=team["owner"], project=team["a"], justification="x")
    assert bad.value.field == "max_gpus"
    with django_capture_on_commit_callbacks(execute=True):
        asked = approval_create(
            kind, actor=team["owner"], project=team["a"], justification="", max_gpus=2
        )
    assert mail.outbox[-1].subject == "Probe request from Alpha"
    assert "asks for 2 probes." in mail.outbox[-1].body and "Why: -" in mail.outbox[-1].body
    with pytest.raises(PermissionDenied):
        approval_approve(kind, actor=team["owner"], request_id=asked.pk)
    with django_capture_on_commit_callbacks(execute=True):
        approval_approve(kind, actor=operator, request_id=asked.pk, reason="fine")
    assert kind.applied == [asked.pk]
    asked.refresh_from_db()
    assert (asked.status, asked.decided_by, asked.decision_reason) == ("approved", operator, "fine")
    with pytest.raises(Conflict):
        approval_decline(kind, actor=operator, request_id=asked.pk, reason="too late")
    events = AuditEvent.objects.filter(action__startswith="probe.request").order_by("pk")
    assert [e.action for e in events] == ["probe.request", "probe.request.approve"]
    assert events.last().data == {"probed": True, "reason": "fine"}
    told = [m for m in mail.outbox if m.subject == "Probe request for Alpha approved"]
    assert told and "Your probe request for 2 was approved. Probed.\n\nReason: fine" in told[0].body


def test_a_decline_needs_a_reason_and_applies_nothing(team, operator):
    kind = Probe()
    asked = approval_create(
        kind, actor=team["owner"], project=team["a"], justification="why", max_gpus=1
    )
    with pytest.raises(DomainError) as bad:
        approval_decline(kind, actor=operator, request_id=asked.pk, reason="  ")
    assert bad.value.field == "reason"
    approval_decline(kind, actor=operator, request_id=asked.pk, reason="no")
    asked.refresh_from_db()
    assert asked.status == "declined" and kind.applied == []
