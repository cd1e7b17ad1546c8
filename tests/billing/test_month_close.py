"""Closing a month shows its progress (accounts done / total, ETA) and ends with a summary: as
a page action for finance staff (a Celery task the page polls) and as `manage.py close_month`."""

from __future__ import annotations

import io
from datetime import date, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from billing import services
from billing.models import Invoice, MonthClose
from billing.services.month_close import month_close_run, month_close_start
from portal.errors import Conflict, DomainError, PermissionDenied
from portal.models import AuditEvent
from tests.billing.conftest import at
from tests.polling import wait_for

MARCH = date(2025, 3, 1)


@pytest.fixture
def march(lab, place, make_user):
    """Usage of two projects (so two billing accounts) in March 2025, and an operator."""
    h100_b = lab["nodes"]["h2"].gpus.order_by("pk").first()
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 03:00"))
    place(project=lab["b"], gpu=h100_b, start=at("2025-03-11 00:00"), end=at("2025-03-11 02:00"))
    for project in (lab["a"], lab["b"]):
        services.account_open_for_project(project=project)
    return {**lab, "staff": make_user(staff=True)}


@pytest.mark.django_db
def test_the_close_counts_accounts_as_it_goes_and_ends_with_a_summary(march):
    run = month_close_start(actor=march["staff"], period_start=MARCH, run_in_background=False)
    with pytest.raises(Conflict):
        month_close_start(actor=march["staff"], period_start=MARCH)
    seen: list[tuple[int, int | None]] = []
    run = month_close_run(close_id=run.pk, progress=lambda r: seen.append((r.processed, r.total)))
    assert seen == [(0, 2), (1, 2), (2, 2)]
    assert (run.status, run.done, run.failed, run.total) == ("done", 2, 0, 2)
    issued = Invoice.objects.filter(period_start=MARCH).exclude(status="draft")
    assert run.summary["invoices"] == issued.count() == 2
    total = sum(i.total for i in issued)
    assert run.summary["totals"] == {"usd": str(total)} and total > 0
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"billing.month_close.start", "billing.month_close.finish"} <= actions
    # a second close of the month finds nothing left to close; a finished run is not rerun
    again = month_close_start(actor=None, period_start=MARCH, run_in_background=False)
    assert month_close_run(close_id=again.pk).total == 0
    assert month_close_run(close_id=run.pk).done == 2


@pytest.mark.django_db
def test_only_finance_closes_and_only_ended_months(march):
    with pytest.raises(PermissionDenied):
        month_close_start(actor=march["owner"], period_start=MARCH)
    this_month = timezone.now().date().replace(day=1)
    with pytest.raises(DomainError, match="has not ended yet"):
        month_close_start(actor=march["staff"], period_start=this_month)
    assert not MonthClose.objects.exists()


@pytest.mark.django_db
def test_one_failing_account_is_named_and_the_others_close(march, monkeypatch):
    from billing.services import month_close

    real = month_close.invoice_close
    first = min(services.invoices_close_month(period_start=MARCH))

    def flaky(*, account_id, **kwargs):
        if account_id == first:
            raise RuntimeError("tax service unreachable")
        return real(account_id=account_id, **kwargs)

    monkeypatch.setattr(month_close, "invoice_close", flaky)
    run = month_close_start(actor=None, period_start=MARCH, run_in_background=False)
    run = month_close_run(close_id=run.pk)
    assert (run.done, run.failed) == (1, 1)
    assert run.summary["accounts_failed"] == [
        {"account": first, "error": "tax service unreachable"}
    ]


@pytest.mark.django_db
def test_command_shows_a_progress_bar_and_a_summary(march):
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "close_month", "--period", "2025-03-15", "--progress", "always", stdout=out, stderr=err
    )
    assert "2/2 accounts" in err.getvalue() and "ETA" in err.getvalue()
    summary = out.getvalue()
    assert "Closed March 2025: 2 of 2 accounts closed, 0 failed; 2 invoices issued" in summary
    with pytest.raises(CommandError, match="YYYY-MM-DD"):
        call_command("close_month", "--period", "March")
    future = (timezone.now() + timedelta(days=40)).date().isoformat()
    with pytest.raises(CommandError, match="has not ended yet"):
        call_command("close_month", "--period", future)


@pytest.mark.django_db
def test_page_shows_progress_with_eta_then_the_summary(client, march):
    client.force_login(march["owner"])
    assert client.get("/billing/operator/close/").status_code == 403
    client.force_login(march["staff"])
    assert 'value="' in client.get("/billing/operator/close/").content.decode()
    bad = client.post("/billing/operator/close/", {"month": "2025-13"})
    assert "month must be YYYY-MM" in bad.content.decode()
    resp = client.post("/billing/operator/close/", {"month": "2025-03"})
    run = MonthClose.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/billing/operator/close/{run.pk}/"
    page = client.get(resp["Location"]).content.decode()
    assert 'hx-trigger="every 1s"' in page and "finding the accounts" in page
    MonthClose.objects.filter(pk=run.pk).update(
        total=40, done=10, started_at=timezone.now() - timedelta(seconds=30)
    )
    poll = client.get(resp["Location"], HTTP_HX_REQUEST="true")
    assert poll.status_code == 200
    assert "10 of 40 accounts done" in poll.content.decode()
    assert "about 1m30s left" in poll.content.decode()
    MonthClose.objects.filter(pk=run.pk).update(total=None, done=0)
    month_close_run(close_id=run.pk)
    poll = client.get(resp["Location"], HTTP_HX_REQUEST="true")
    assert poll.status_code == 286  # htmx stops polling: it is over
    assert "2 closed" in poll.content.decode() and "2 issued" in poll.content.decode()


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_the_page_runs_the_close_on_the_worker(client, march, celery_live_worker):
    client.force_login(march["staff"])
    resp = client.post("/billing/operator/close/", {"month": "2025-03"})
    run = MonthClose.objects.get()
    wait_for(lambda: MonthClose.objects.get(pk=run.pk).status == "done", timeout=30)
    poll = client.get(resp["Location"], HTTP_HX_REQUEST="true")
    assert poll.status_code == 286 and "2 closed" in poll.content.decode()
