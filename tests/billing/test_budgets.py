"""Budgets: notifications at 50/80/100 %, the hard cap at admission and in the cycle,
the preemptible offer, and overdue payments stopping new jobs."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.utils import timezone

from billing import admission, selectors, services
from billing.models import BudgetAlert, Notification
from scheduler.cycle import run_cycle
from scheduler.models import Job

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def mid_month(monkeypatch):
    """Pin the clock mid-month so 'hours ago' stays inside the running month."""
    from tests.billing.conftest import at

    fixed = at("2025-06-15 12:00")
    monkeypatch.setattr("django.utils.timezone.now", lambda: fixed)
    return fixed


def spend_hours(place, hours: float, **kw):
    """Usage this month ending a minute ago (so it is inside the running month)."""
    now = timezone.now()
    start = max(
        now - timedelta(hours=hours, minutes=1),
        now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
    )
    return place(start=start, end=start + timedelta(hours=hours), **kw)


def submit(api, user, **fields):
    body = {"project": "alpha", "name": "train", "command": "python train.py", **fields}
    resp = api(user).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def rate(lab):
    return selectors.quote_rate(gpu_model=lab["h100"], preemptible=False)


def test_only_owners_set_budgets_and_bad_input_is_400(lab, api):
    url = "/api/v1/billing/projects/alpha/budget"
    body = {"monthly_amount": "100.00", "hard_cap": True}
    assert api(lab["member"]).put(url, body, format="json").status_code == 403
    assert api(lab["outsider"]).put(url, body, format="json").status_code == 404
    assert api(lab["viewer"]).get(url).status_code == 404  # none yet
    resp = api(lab["owner"]).put(url, body, format="json")
    assert resp.status_code == 200 and resp.json()["monthly_amount"] == "100.00"
    assert api(lab["viewer"]).get(url).json()["hard_cap"] is True
    for bad in (
        {"monthly_amount": "-1"},
        {"monthly_amount": "abc"},
        {"monthly_amount": "1", "colour": "red"},
        {"monthly_amount": "1", "preemptible_allowance_percent": 500},
        [],
    ):
        resp = api(lab["owner"]).put(url, bad, format="json")
        assert resp.status_code == 400, (bad, resp.content)
    assert api(lab["owner"]).delete(url).status_code == 204
    assert api(lab["owner"]).delete(url).status_code == 404


def test_notifications_at_50_80_100_once_each(lab, place, django_capture_on_commit_callbacks):
    budget_amount = (rate(lab) * 10).quantize(Decimal("0.01"))
    services.budget_set(actor=lab["owner"], project=lab["a"], monthly_amount=budget_amount)
    spend_hours(place, 5.5)  # 55 %
    with django_capture_on_commit_callbacks(execute=True):
        assert [a.threshold for a in services.budgets_check()] == [50]
        assert services.budgets_check() == []
    spend_hours(place, 5)  # 105 %: 80 and 100 at once make one notice, naming 100
    with django_capture_on_commit_callbacks(execute=True):
        assert [a.threshold for a in services.budgets_check()] == [100]
    assert BudgetAlert.objects.filter(project=lab["a"]).count() == 3
    notes = list(Notification.objects.filter(project=lab["a"], kind="budget"))
    assert len(notes) == 2 and any("100 %" in n.message for n in notes)
    assert len(mail.outbox) == 2 and mail.outbox[0].to == [lab["owner"].email]


def test_open_hour_of_a_running_job_counts_toward_the_budget(lab, place):
    alloc = place(start=timezone.now() - timedelta(minutes=30))
    spent = selectors.project_spend(project_ids={lab["a"].pk})[lab["a"].pk]
    assert spent > 0
    assert selectors.job_cost(alloc.job) == spent.quantize(Decimal("0.01"))


def test_hard_cap_refuses_new_jobs_and_offers_preemptible(lab, place, api):
    services.budget_set(
        actor=lab["owner"],
        project=lab["a"],
        monthly_amount=(rate(lab) * 2).quantize(Decimal("0.01")),
        hard_cap=True,
        preemptible_allowance_percent=50,
    )
    ok = submit(api, lab["member"], gpu_model="H100-80GB-SXM")
    assert ok["state"] == "queued"
    Job.objects.filter(pk=ok["id"]).update(state="cancelled")
    spend_hours(place, 2.2)  # 110 %: over the cap, within the preemptible allowance
    job = submit(api, lab["member"], gpu_model="H100-80GB-SXM")
    assert job["state"] == "rejected"
    assert "Budget exhausted" in job["failure_reason"] and "preemptible" in job["failure_reason"]
    pre = submit(api, lab["member"], gpu_model="H100-80GB-SXM", preemptible=True)
    assert pre["state"] == "queued"
    assert admission.projects_over_budget(project_ids={lab["a"].pk}) == set()
    spend_hours(place, 1.0)  # 160 %: beyond the allowance, everything waits
    assert admission.projects_over_budget(project_ids={lab["a"].pk}) == {lab["a"].pk}
    Job.objects.filter(project=lab["a"]).exclude(pk=pre["id"]).update(state="cancelled")
    run_cycle()
    waiting = api(lab["member"]).get(f"/api/v1/jobs/{pre['id']}").json()
    assert waiting["state"] == "queued" and waiting["pending"]["reason"] == "budget"
    late = submit(api, lab["member"], gpu_model="H100-80GB-SXM", preemptible=True)
    assert late["state"] == "rejected" and "Budget exhausted" in late["failure_reason"]


def test_overdue_payment_stops_new_jobs_after_grace(lab, api, settings):
    account = services.account_open_for_project(project=lab["a"])
    account.payment_failed_at = timezone.now() - timedelta(
        days=settings.BILLING_PAYMENT_GRACE_DAYS - 1
    )
    account.save()
    assert submit(api, lab["member"])["state"] == "queued"
    account.payment_failed_at = timezone.now() - timedelta(
        days=settings.BILLING_PAYMENT_GRACE_DAYS + 1
    )
    account.save()
    job = submit(api, lab["member"])
    assert job["state"] == "rejected" and "Payment overdue" in job["failure_reason"]
    assert admission.projects_over_budget(project_ids={lab["a"].pk, lab["b"].pk}) == {lab["a"].pk}


def test_dry_run_quotes_from_the_price_list(lab, api):
    services.price_list_seed()
    services.price_publish(
        actor=None,
        gpu_model=lab["h100"],
        effective_from=timezone.now(),
        on_demand_per_gpu_hour=Decimal("1.2345"),
    )
    assert selectors.quote_rate(gpu_model=lab["h100"], preemptible=False) == Decimal("1.2345")


def test_owners_choose_the_alert_thresholds(
    lab, place, client, api, django_capture_on_commit_callbacks
):
    client.force_login(lab["owner"])
    budget_amount = (rate(lab) * 10).quantize(Decimal("0.01"))
    url = "/billing/projects/alpha/budget/"
    resp = client.post(
        url,
        {
            "monthly_amount": budget_amount,
            "preemptible_allowance_percent": "10",
            "alert_thresholds": "90, 25",
        },
    )
    assert resp.status_code == 302
    assert lab["a"].budget.alert_thresholds == [25, 90]
    page = client.get("/billing/projects/alpha/usage/").content.decode()
    assert "25, 90" in page
    for bad in ("0, 50", "50, 101", "fifty", "1,2,3,4,5,6"):
        resp = client.post(
            url,
            {
                "monthly_amount": budget_amount,
                "preemptible_allowance_percent": "10",
                "alert_thresholds": bad,
            },
            follow=True,
        )
        assert "The budget was not saved" in resp.content.decode(), bad
    lab["a"].budget.refresh_from_db()
    assert lab["a"].budget.alert_thresholds == [25, 90]
    client.force_login(lab["member"])
    client.post(
        url, {"monthly_amount": "1", "preemptible_allowance_percent": "10", "alert_thresholds": "1"}
    )
    assert lab["a"].budget.alert_thresholds == [25, 90]  # members do not set them

    # the API sets the amount and keeps the owners' thresholds
    resp = api(lab["owner"]).put(
        "/api/v1/billing/projects/alpha/budget",
        {"monthly_amount": str(budget_amount)},
        format="json",
    )
    assert resp.status_code == 200
    lab["a"].budget.refresh_from_db()
    assert lab["a"].budget.alert_thresholds == [25, 90]

    spend_hours(place, 3)  # 30 %: past 25, where the default thresholds say nothing yet
    with django_capture_on_commit_callbacks(execute=True):
        assert [a.threshold for a in services.budgets_check()] == [25]
    assert "(25 %)" in mail.outbox[-1].body
