"""Requests with approval (quota, reserved plans), owners' own limits and the operator queue.

E-mails are sent after commit: requests that send one run in
`django_capture_on_commit_callbacks(execute=True)`.
"""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

from billing.models import ReservationRequest, ReservedPlan
from portal.models import AuditEvent
from scheduler.admission import JobSpec, job_submit
from scheduler.models import JobState, Quota, QuotaModelLimit, QuotaRequest

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(django_capture_on_commit_callbacks):
    return lambda: django_capture_on_commit_callbacks(execute=True)


@pytest.fixture
def operator(make_user):
    return make_user("ops@example.org", staff=True)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def quota_snapshot(project) -> tuple:
    quota = Quota.objects.get(project=project)
    return (
        quota.max_gpus,
        quota.gpu_hours_per_month,
        quota.max_gpus_per_member,
        sorted(QuotaModelLimit.objects.filter(quota=quota).values_list("gpu_model_id", "max_gpus")),
    )


def ask_quota(team, fleet, sent, **fields):
    body = {"justification": "a bigger sweep", **fields}
    with sent():
        resp = signed_in(team["owner"]).post("/projects/alpha/requests/quota/", body)
    assert resp.status_code == 302
    return QuotaRequest.objects.filter(project=team["a"]).latest("created_at")


def test_quota_request_approved_changes_the_quota_and_tells_both_sides(team, fleet, operator, sent):
    Quota.objects.filter(project=team["a"]).update(max_gpus=4, gpu_hours_per_month=100)
    request = ask_quota(
        team,
        fleet,
        sent,
        max_gpus="16",
        gpu_hours_per_month="2000",
        gpu_model="H100-80GB-SXM",
        model_max_gpus="8",
    )
    assert request.status == "pending"
    assert [m.to for m in mail.outbox] == [[operator.email]]
    assert quota_snapshot(team["a"])[:2] == (4, 100)  # nothing changes before a decision

    queue = signed_in(operator).get("/ops/requests/")
    assert queue.status_code == 200 and "a bigger sweep" in queue.content.decode()
    with sent():
        resp = signed_in(operator).post(
            f"/ops/requests/quota/{request.pk}/decide/", {"decision": "approve", "reason": "ok"}
        )
    assert resp.status_code == 302
    request.refresh_from_db()
    assert request.status == "approved" and request.decided_by == operator
    assert quota_snapshot(team["a"]) == (16, 2000, None, [(fleet["h100"].pk, 8)])
    assert mail.outbox[-1].to == [team["owner"].email]
    assert "approved" in mail.outbox[-1].subject
    actions = set(AuditEvent.objects.filter(project=team["a"]).values_list("action", flat=True))
    assert {"quota.request", "quota.request.approve"} <= actions
    # Decided once.
    signed_in(operator).post(
        f"/ops/requests/quota/{request.pk}/decide/", {"decision": "decline", "reason": "no"}
    )
    request.refresh_from_db()
    assert request.status == "approved"


def test_a_declined_request_changes_nothing(team, fleet, operator, sent):
    Quota.objects.filter(project=team["a"]).update(max_gpus=4)
    before = quota_snapshot(team["a"])
    request = ask_quota(team, fleet, sent, max_gpus="64")
    client = signed_in(operator)
    # A decline needs a reason.
    client.post(f"/ops/requests/quota/{request.pk}/decide/", {"decision": "decline"})
    request.refresh_from_db()
    assert request.status == "pending"
    with sent():
        client.post(
            f"/ops/requests/quota/{request.pk}/decide/",
            {"decision": "decline", "reason": "the pool is full until March"},
        )
    request.refresh_from_db()
    assert request.status == "declined" and request.decision_reason.startswith("the pool")
    assert quota_snapshot(team["a"]) == before
    assert mail.outbox[-1].to == [team["owner"].email]
    assert "the pool is full until March" in mail.outbox[-1].body


def test_only_owners_ask_and_only_operators_decide(team, fleet, operator, sent):
    for who in ("member", "viewer"):
        with sent():
            signed_in(team[who]).post(
                "/projects/alpha/requests/quota/", {"max_gpus": "9", "justification": "x"}
            )
    assert (
        signed_in(team["outsider"])
        .post("/projects/alpha/requests/quota/", {"max_gpus": "9", "justification": "x"})
        .status_code
        == 404
    )
    assert not QuotaRequest.objects.exists()
    request = ask_quota(team, fleet, sent, max_gpus="9")
    before = quota_snapshot(team["a"])
    for who in ("owner", "member", "viewer", "outsider"):
        client = signed_in(team[who])
        assert client.get("/ops/requests/").status_code == 403
        resp = client.post(
            f"/ops/requests/quota/{request.pk}/decide/", {"decision": "approve", "reason": ""}
        )
        assert resp.status_code == 403
    request.refresh_from_db()
    assert request.status == "pending" and quota_snapshot(team["a"]) == before


def test_empty_quota_request_is_refused(team, fleet, sent):
    with sent():
        resp = signed_in(team["owner"]).post(
            "/projects/alpha/requests/quota/", {"justification": "more"}, follow=True
        )
    assert "at least one change" in resp.content.decode()
    assert not QuotaRequest.objects.exists() and not mail.outbox


def test_reservation_request_approved_creates_a_billed_plan(team, fleet, operator, sent):
    with sent():
        resp = signed_in(team["owner"]).post(
            "/billing/projects/alpha/reservations/request/",
            {"gpu_model": "H100-80GB-SXM", "gpus": "2", "term_months": "12"},
        )
    assert resp.status_code == 302
    request = ReservationRequest.objects.get(project=team["a"])
    assert mail.outbox[-1].to == [operator.email]
    assert not ReservedPlan.objects.exists()
    with sent():
        signed_in(operator).post(
            f"/billing/operator/reservation-requests/{request.pk}/decide/",
            {"decision": "approve"},
        )
    request.refresh_from_db()
    plan = ReservedPlan.objects.get()
    assert request.status == "approved" and request.plan == plan
    assert (plan.project, plan.gpu_model, plan.gpus, plan.term_months) == (
        team["a"],
        fleet["h100"],
        2,
        12,
    )
    assert plan.monthly_fee > 0  # priced by billing's rules from the price in effect
    assert (
        mail.outbox[-1].to == [team["owner"].email]
        and str(plan.monthly_fee) in mail.outbox[-1].body
    )


def test_declined_reservation_creates_no_plan(team, fleet, operator, sent):
    with sent():
        signed_in(team["owner"]).post(
            "/billing/projects/alpha/reservations/request/",
            {"gpu_model": "L4", "gpus": "1", "term_months": "1"},
        )
    request = ReservationRequest.objects.get()
    with sent():
        signed_in(operator).post(
            f"/billing/operator/reservation-requests/{request.pk}/decide/",
            {"decision": "decline", "reason": "use pay-as-you-go"},
        )
    request.refresh_from_db()
    assert request.status == "declined" and not ReservedPlan.objects.exists()
    assert "use pay-as-you-go" in mail.outbox[-1].body


def test_bad_reservation_terms_are_form_errors(team, fleet, sent):
    resp = signed_in(team["owner"]).post(
        "/billing/projects/alpha/reservations/request/",
        {"gpu_model": "H100-80GB-SXM", "gpus": "2", "term_months": "7"},
        follow=True,
    )
    assert "not sent" in resp.content.decode() and not ReservationRequest.objects.exists()


def test_owner_cannot_raise_own_limits_beyond_the_grant(team, fleet):
    Quota.objects.filter(project=team["a"]).update(max_gpus=8)
    owner = signed_in(team["owner"])
    resp = owner.post("/projects/alpha/limits/", {"max_gpus_per_member": "9"}, follow=True)
    assert "granted 8" in resp.content.decode()
    assert Quota.objects.get(project=team["a"]).max_gpus_per_member is None
    owner.post("/projects/alpha/limits/", {"max_gpus_per_member": "2"})
    assert Quota.objects.get(project=team["a"]).max_gpus_per_member == 2
    # Members cannot set it at all.
    signed_in(team["member"]).post("/projects/alpha/limits/", {"max_gpus_per_member": "8"})
    assert Quota.objects.get(project=team["a"]).max_gpus_per_member == 2
    # The page shows the grant and the request forms to owners only.
    assert owner.get("/projects/alpha/requests/").status_code == 200
    assert signed_in(team["member"]).get("/projects/alpha/requests/").status_code == 403


def test_per_member_cap_is_enforced_at_admission(team, fleet):
    Quota.objects.filter(project=team["a"]).update(max_gpus=8, max_gpus_per_member=2)
    first = job_submit(
        actor=team["member"], project=team["a"], spec=JobSpec(name="a", command="true", gpus=2)
    )[0]
    assert first.state == JobState.QUEUED
    over = job_submit(
        actor=team["member"], project=team["a"], spec=JobSpec(name="b", command="true", gpus=1)
    )[0]
    assert over.state == JobState.REJECTED and "may ask for at once" in over.failure_reason
    # Another member has their own allowance.
    other = job_submit(
        actor=team["owner"], project=team["a"], spec=JobSpec(name="c", command="true", gpus=2)
    )[0]
    assert other.state == JobState.QUEUED


def test_storage_quota_requests_are_listed_and_decided_on_the_operators_queue(team, operator, sent):
    from storage.models import StorageQuota, StorageQuotaRequest

    with sent():
        signed_in(team["owner"]).post(
            "/projects/alpha/storage/request/", {"max_gib": "750", "justification": "new corpus"}
        )
    asked = StorageQuotaRequest.objects.get(project=team["a"])
    assert asked.status == "pending" and [m.to for m in mail.outbox] == [[operator.email]]
    assert mail.outbox[0].subject == f"Storage quota request from {team['a'].name}"
    queue = signed_in(operator).get("/ops/requests/").content.decode()
    row = queue[queue.index('data-testid="storage-queue"') :]
    assert "new corpus" in row and "750 GiB" in row
    assert f"/ops/storage/requests/{asked.pk}/decide/" in row  # decidable from the queue
    with sent():
        resp = signed_in(operator).post(
            f"/ops/storage/requests/{asked.pk}/decide/", {"decision": "approve", "reason": "ok"}
        )
    assert resp.status_code == 302 and resp["Location"] == "/ops/requests/"
    asked.refresh_from_db()
    assert asked.status == "approved" and asked.decided_by == operator
    assert StorageQuota.objects.get(project=team["a"]).max_gib == 750
    assert mail.outbox[-1].to == [team["owner"].email]
    assert "750 GiB" in mail.outbox[-1].body and "approved" in mail.outbox[-1].subject
    actions = set(AuditEvent.objects.filter(project=team["a"]).values_list("action", flat=True))
    assert {"storage.quota.request", "storage.quota.request.approve", "storage.quota.set"} <= (
        actions
    )
    queue = signed_in(operator).get("/ops/requests/").content.decode()
    assert "No storage quota requests waiting." in queue
    assert "Storage quota: 750 GiB" in queue  # among the recent decisions
