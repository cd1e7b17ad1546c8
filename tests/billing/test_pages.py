"""Pages and API: usage and cost, invoices and PDF, exports, revenue; scoped per tenant."""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing import exports, services
from billing.models import Budget, Invoice
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db


@pytest.fixture
def billed(lab, place):
    """March usage on alpha, closed into an invoice; some usage this month too."""
    for day in (3, 4, 5):
        place(start=at(f"2025-03-{day:02d} 10:00"), end=at(f"2025-03-{day:02d} 12:00"))
    account = services.account_open_for_project(project=lab["a"])
    invoice = services.invoice_close(
        account_id=account.pk, period_start=date(2025, 3, 1), now=at("2025-04-01 01:00")
    )
    now = timezone.now()
    place(start=max(now - timedelta(hours=2), now.replace(day=1, hour=0, minute=0)))
    return {**lab, "invoice": invoice}


def login(client, user):
    client.force_login(user)
    return client


def test_usage_page_by_model_job_and_day(billed, client, django_assert_max_num_queries):
    c = login(client, billed["viewer"])
    with django_assert_max_num_queries(30):
        resp = c.get("/billing/projects/alpha/usage/?month=2025-03")
    html = resp.content.decode()
    assert resp.status_code == 200
    assert "H100-80GB-SXM" in html and "6.0000" in html  # 3 × 2 GPU-hours
    assert 'data-testid="by-day"' in html and "Mon 3 Mar" in html
    assert "Save budget" not in html  # viewers do not manage budgets
    assert "?month=2025-04" in html and "?month=2025-02" in html  # a past month links both ways
    now_page = c.get("/billing/projects/alpha/usage/").content.decode()
    assert 'data-testid="forecast"' in now_page and "open hour" in now_page
    assert " →</a>" not in now_page  # nothing to show after the month now running
    partial = c.get("/billing/projects/alpha/usage/?month=2025-03", HTTP_HX_REQUEST="true")
    assert b"<html" not in partial.content and b"by-model" in partial.content
    assert "HX-Request" in partial["Vary"]


def test_bad_month_is_400_and_other_tenants_are_404(billed, client):
    c = login(client, billed["viewer"])
    assert c.get("/billing/projects/alpha/usage/?month=2025-13").status_code == 400
    assert c.get("/billing/projects/alpha/usage/?month=soon").status_code == 400
    assert c.get("/billing/projects/beta/usage/").status_code == 404
    c = login(client, billed["outsider"])
    inv = billed["invoice"]
    for url in (
        f"/billing/invoices/{inv.pk}/",
        f"/billing/invoices/{inv.pk}/pdf/",
        "/billing/projects/alpha/invoices/",
        "/billing/projects/alpha/usage.csv",
    ):
        assert c.get(url).status_code == 404, url
    assert c.get("/billing/operator/revenue/").status_code == 403


def test_owner_sets_budget_from_the_page_with_csrf(billed, client):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(billed["owner"])
    url = "/billing/projects/alpha/budget/"
    assert strict.post(url, {"monthly_amount": "50"}).status_code == 403  # no CSRF token
    page = strict.get("/billing/projects/alpha/usage/")
    token = page.cookies["csrftoken"].value
    resp = strict.post(
        url,
        {
            "monthly_amount": "50.00",
            "hard_cap": "on",
            "preemptible_allowance_percent": "5",
            "csrfmiddlewaretoken": token,
        },
    )
    assert resp.status_code == 302
    budget = Budget.objects.get(project=billed["a"])
    assert budget.monthly_amount == Decimal("50.00") and budget.hard_cap
    c = login(client, billed["member"])
    c.post(url, {"monthly_amount": "1", "preemptible_allowance_percent": "5"})
    assert Budget.objects.get(project=billed["a"]).monthly_amount == Decimal("50.00")


def test_invoice_list_detail_lines_and_pdf(billed, client, django_assert_max_num_queries):
    inv = billed["invoice"]
    c = login(client, billed["viewer"])
    with django_assert_max_num_queries(12):
        listing = c.get("/billing/projects/alpha/invoices/").content.decode()
    assert inv.number in listing
    detail = c.get(f"/billing/invoices/{inv.pk}/").content.decode()
    assert inv.number in detail and str(inv.total) in detail and "platform faults" in detail
    line = inv.lines.get(kind="usage")
    records = c.get(f"/billing/invoices/{inv.pk}/lines/{line.pk}/").content.decode()
    assert "6 usage records" in records
    pdf = c.get(f"/billing/invoices/{inv.pk}/pdf/")
    assert pdf["Content-Type"] == "application/pdf" and pdf.content.startswith(b"%PDF")


def test_api_usage_invoices_job_cost_and_prices(billed, api):
    client = api(billed["viewer"])
    usage = client.get("/api/v1/billing/projects/alpha/usage?month=2025-03").json()
    assert usage["to_date"] == str(billed["invoice"].total)
    assert usage["by_model"][0]["gpu_hours"] == "6.0000" and len(usage["by_day"]) == 3
    assert client.get("/api/v1/billing/projects/alpha/usage?month=x").status_code == 400
    invoices = client.get("/api/v1/billing/projects/alpha/invoices").json()
    assert invoices["results"][0]["number"] == billed["invoice"].number
    detail = client.get(f"/api/v1/billing/invoices/{billed['invoice'].pk}").json()
    assert sum(Decimal(line["amount"]) for line in detail["lines"]) == Decimal(detail["total"])
    job_id = billed["invoice"].usage_records.first().job_id
    cost = client.get(f"/api/v1/billing/jobs/{job_id}/cost").json()
    assert Decimal(cost["cost"]) > 0
    assert api(billed["outsider"]).get(f"/api/v1/billing/jobs/{job_id}/cost").status_code == 404
    assert (
        api(billed["outsider"]).get(f"/api/v1/billing/invoices/{billed['invoice'].pk}").status_code
        == 404
    )
    prices = client.get("/api/v1/billing/prices").json()
    assert {p["gpu_model"] for p in prices} >= {"H100-80GB-SXM", "L4"}


def test_csv_and_focus_exports(billed, client):
    c = login(client, billed["viewer"])
    body = b"".join(c.get("/billing/projects/alpha/usage.csv?month=2025-03").streaming_content)
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert len(rows) == 6 and set(rows[0]) == set(exports.CSV_COLUMNS)
    total = sum(Decimal(r["amount"]) for r in rows)
    assert abs(total - billed["invoice"].total) < Decimal("0.005")
    body = b"".join(c.get("/billing/projects/alpha/focus.csv?month=2025-03").streaming_content)
    focus = list(csv.DictReader(io.StringIO(body.decode())))
    assert list(focus[0]) == exports.FOCUS_COLUMNS
    assert {r["ChargeCategory"] for r in focus} == {"Usage", "Tax"}  # the tax line, at 0 %
    assert {r["PricingUnit"] for r in focus if r["ChargeCategory"] == "Usage"} == {"GPU-Hours"}
    assert (
        focus[0]["SubAccountId"] == "alpha"
        and focus[0]["BillingPeriodStart"] == "2025-03-01T00:00:00Z"
    )
    assert sum(Decimal(r["BilledCost"]) for r in focus) == billed["invoice"].total


def test_operator_revenue_view(billed, client, make_user):
    c = login(client, make_user(staff=True))
    html = c.get("/billing/operator/revenue/?month=2025-03").content.decode()
    assert "H100-80GB-SXM" in html and "6.0000" in html
    assert str(Invoice.objects.get().total) in html
