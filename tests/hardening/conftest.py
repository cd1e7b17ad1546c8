"""Hardening fixtures: a populated project A (job, invoice, budget, tokens) and project B."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults: fault-injection tests on the real stack (slow; -m 'not faults')"
    )


def _at(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


@pytest.fixture
def world(team, fleet, make_user, settings, tmp_path):
    """Everything the authorization matrix fills URL parameters with, all of project A."""
    from decimal import Decimal

    from billing import services as billing
    from billing.models import InvoiceLine
    from portal.models import Membership
    from portal.services import token_create
    from scheduler.admission import JobSpec, job_submit
    from scheduler.models import Allocation, Gpu, Job, JobState

    a, b = team["a"], team["b"]
    staff = make_user("operator@example.org", staff=True)
    spare = make_user("spare@example.org")
    job = job_submit(actor=team["member"], project=a, spec=JobSpec(name="matrix", command="true"))[
        0
    ]
    # An array of two shards, the second failed: its page and "retry failed shards".
    array = job_submit(
        actor=team["member"],
        project=a,
        spec=JobSpec(name="matrix-array", command="true", shard_count=2),
    )[0]
    Job.objects.filter(array_parent=array).update(state=JobState.FAILED)
    other_job = job_submit(
        actor=team["outsider"], project=b, spec=JobSpec(name="theirs", command="true")
    )[0]
    # A finished, billed job of project A so that an invoice with lines exists.
    gpu = Gpu.objects.filter(model=fleet["h100"]).order_by("pk").first()
    billed = Job.objects.create(
        project=a,
        submitted_by=team["owner"],
        name="billed",
        command="true",
        gpu_model=gpu.model,
        state=JobState.SUCCEEDED,
    )
    Allocation.objects.create(
        job=billed,
        gpu=gpu,
        node=gpu.node,
        attempt=1,
        share_milli=1000,
        gpu_model=gpu.model,
        started_at=_at("2025-03-10 00:00"),
        ended_at=_at("2025-03-10 05:00"),
        end_reason="completed",
    )
    account = billing.account_open_for_project(project=a)
    invoice = billing.invoice_close(
        account_id=account.pk, period_start=date(2025, 3, 1), now=_at("2025-04-01 01:00")
    )
    line = InvoiceLine.objects.filter(invoice=invoice).order_by("position").first()
    billing.budget_set(actor=team["owner"], project=a, monthly_amount=Decimal("500"))
    tokens = {
        role: token_create(user=team[role], name=f"{role}-api").secret
        for role in ("owner", "member", "viewer", "outsider")
    }
    tokens["staff"] = token_create(user=staff, name="staff-api").secret
    owner_token = token_create(user=team["owner"], name="target")
    from django.core import signing

    from portal import accounts

    invitation = accounts.invitation_create(
        actor=team["owner"], project=a, email=spare.email, role="member", base_url="http://x/"
    )
    from billing.reservation_requests import reservation_request_create
    from scheduler.quota_requests import quota_request_create

    quota_request = quota_request_create(
        actor=team["owner"], project=a, max_gpus=64, justification="matrix"
    )
    reservation_request = reservation_request_create(
        actor=team["owner"], project=a, gpu_model=fleet["h100"], gpus=1, term_months=1
    )
    from django_otp.plugins.otp_totp.models import TOTPDevice

    staff_device = TOTPDevice.objects.create(user=staff, name="matrix", confirmed=True)
    email_token = signing.dumps(
        {"uid": team["owner"].pk, "old": team["owner"].email, "new": "owner-new@example.org"},
        salt=accounts.EMAIL_CHANGE_SALT,
    )
    from scheduler.job_templates import job_template_create

    template = job_template_create(actor=team["member"], job=job, name="matrix")
    from billing.models import MonthClose
    from storage.quota_requests import storage_request_create
    from storage.services import volume_create

    settings.STORAGE_SHARED_ROOT = str(tmp_path / "shared")
    volume = volume_create(
        actor=team["member"], project=a, name="matrix-vol", kind="shared", size_gib=1
    )
    dataset = volume_create(
        actor=team["member"],
        project=a,
        name="matrix-ds",
        kind="shared",
        size_gib=1,
        is_dataset=True,
    )
    storage_request = storage_request_create(
        actor=team["owner"], project=a, max_gib=500, justification="matrix"
    )

    month_close = MonthClose.objects.create(period_start=date(2019, 12, 1), status="done")
    return {
        **team,
        **fleet,
        "template": template,
        "month_close": month_close,
        "staff": staff,
        "spare": spare,
        "job": job,
        "array": array,
        "other_job": other_job,
        "invoice": invoice,
        "line": line,
        "membership": Membership.objects.get(project=a, user=team["member"]),
        "target_token": owner_token.token,
        "tokens": tokens,
        "node": fleet["nodes"]["h1"],
        "node_token": fleet["tokens"]["h1"],
        "invitation": invitation.invitation,
        "staff_device": staff_device,
        "quota_request": quota_request,
        "reservation_request": reservation_request,
        "volume": volume,
        "dataset": dataset,
        "storage_request": storage_request,
        "invitation_token": invitation.token,
        "email_token": email_token,
        "signup_token": signing.dumps({"email": "matrix@example.org"}, salt=accounts.SIGNUP_SALT),
    }
