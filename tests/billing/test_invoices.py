"""Monthly close: lines per model and plan, reserved versus overage, credits, faults, tax,
late usage; every line traceable to its records; idempotent."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest

from billing import pricing, selectors, services
from billing.models import (
    Adjustment,
    CreditApplication,
    Invoice,
    InvoiceLine,
    PriceVersion,
    UsageRecord,
)
from portal.errors import DomainError
from scheduler.models import Gpu
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
MARCH = date(2025, 3, 1)
APRIL_1 = at("2025-04-01 00:30")


def h100s():
    return list(Gpu.objects.filter(model__name="H100-80GB-SXM").order_by("pk"))


def close(project, period=MARCH, now=APRIL_1):
    account = services.account_open_for_project(project=project)
    return services.invoice_close(account_id=account.pk, period_start=period, now=now)


def assert_consistent(invoice: Invoice) -> None:
    lines = list(invoice.lines.all())
    assert sum(line.amount for line in lines) == invoice.total
    for line in lines:
        if line.kind in ("usage", "preemptible", "late_usage"):
            records = selectors.line_records(line=line)
            assert records.count() == line.record_count > 0
            assert line.amount == pricing.to_cents(sum(r.amount for r in records))
        if line.kind == "fault_credit":
            records = selectors.line_records(line=line)
            assert line.amount == -pricing.to_cents(sum(r.amount for r in records))
    billable = sum(r.amount for r in UsageRecord.objects.filter(invoice=invoice))
    usage_lines = sum(
        line.amount for line in lines if line.kind in ("usage", "preemptible", "late_usage")
    )
    assert abs(usage_lines - billable) <= Decimal("0.005") * max(1, len(lines))


def test_pay_as_you_go_month_close(lab, place):
    gpu = h100s()[0]
    a = place(gpu=gpu, start=at("2025-03-03 10:00"), end=at("2025-03-03 12:30"))
    place(gpu=gpu, share=500, start=at("2025-03-04 00:00"), end=at("2025-03-04 02:00"))
    place(gpu=gpu, preemptible=True, start=at("2025-03-05 00:00"), end=at("2025-03-05 01:00"))
    invoice = close(lab["a"])
    kinds = [(line.kind, line.gpu_hours) for line in invoice.lines.order_by("position")]
    assert kinds == [
        ("usage", Decimal("3.5000")),
        ("preemptible", Decimal("1.0000")),
        ("tax", None),
    ]
    rate = PriceVersion.objects.get(gpu_model=lab["h100"]).on_demand_per_gpu_hour
    assert invoice.lines.get(kind="usage").amount == pricing.to_cents(rate * Decimal("3.5"))
    assert invoice.status == "open" and invoice.number == "GPC-000001"
    assert_consistent(invoice)
    # each line is traceable to jobs
    jobs = {row["job_id"] for row in selectors.invoice_job_summary(invoice=invoice)}
    assert a.job_id in jobs and len(jobs) == 3
    # closing again changes nothing
    again = close(lab["a"])
    assert again.pk == invoice.pk and again.lines.count() == 3
    assert not UsageRecord.objects.filter(invoice__isnull=True, period_start=MARCH).exists()


def test_the_invoice_shows_an_elastic_jobs_periods_at_each_size(lab, place, client):
    """An elastic job shrunk from 3 GPUs to 1: one period per attempt, each with its GPUs."""
    gpus = h100s()
    first = place(gpu=gpus[0], start=at("2025-03-03 10:00"), end=at("2025-03-03 11:00"))
    job = first.job
    for gpu in gpus[1:3]:
        place(gpu=gpu, job=job, start=at("2025-03-03 10:00"), end=at("2025-03-03 11:00"))
    job.allocations.update(attempt=1)
    place(gpu=gpus[3], job=job, start=at("2025-03-03 11:00"), end=at("2025-03-03 13:00"))
    invoice = close(lab["a"])
    (row,) = selectors.invoice_job_summary(invoice=invoice)
    assert [(p["gpus"], p["start"], p["end"]) for p in row["periods"]] == [
        (3, at("2025-03-03 10:00"), at("2025-03-03 11:00")),
        (1, at("2025-03-03 11:00"), at("2025-03-03 13:00")),
    ]
    client.force_login(lab["owner"])
    page = client.get(f"/billing/invoices/{invoice.pk}/").content.decode()
    periods = page.split('data-testid="job-periods">', 1)[1].split("</td>", 1)[0]
    assert "3 GPUs Mar 3 10:00–11:00" in periods and "1 GPU Mar 3 11:00–13:00" in periods


def test_cannot_close_a_running_month(lab):
    with pytest.raises(DomainError, match="not ended"):
        close(lab["a"], now=at("2025-03-20 00:00"))


def test_reserved_covers_its_gpus_and_the_rest_is_overage(lab, place):
    account = services.account_open_for_project(project=lab["a"])
    plan = services.reserved_plan_create(
        actor=None,
        account=account,
        gpu_model=lab["h100"],
        gpus=1,
        term_months=12,
        starts_at=at("2025-03-01 00:00"),
    )
    g1, g2 = h100s()[:2]
    place(gpu=g1, start=at("2025-03-10 00:00"), end=at("2025-03-10 10:00"))
    place(gpu=g2, start=at("2025-03-10 05:00"), end=at("2025-03-10 15:00"))
    invoice = close(lab["a"])
    lines = {line.kind: line for line in invoice.lines.all()}
    assert lines["reserved_fee"].amount == plan.monthly_fee
    assert lines["covered"].gpu_hours == Decimal("15.0000") and lines["covered"].amount == 0
    assert lines["usage"].gpu_hours == Decimal("5.0000")
    version = PriceVersion.objects.get(gpu_model=lab["h100"])
    assert lines["usage"].amount == pricing.to_cents(version.on_demand_per_gpu_hour * 5)
    assert plan.monthly_fee == pricing.reserved_monthly_fee(
        on_demand=version.on_demand_per_gpu_hour, gpus=1, discount=version.reserved_discount_12m
    )
    assert_consistent(invoice)
    assert selectors.reserved_gpus_by_project(now=at("2025-03-15 00:00")) == {
        "alpha": {"H100-80GB-SXM": 1}
    }
    assert selectors.reserved_gpus_by_project(now=at("2026-03-02 00:00")) == {}


def test_credits_are_drawn_down_first_and_tax_applies_to_the_rest(lab, place):
    account = services.account_open_for_project(project=lab["a"])
    account.tax_rate = Decimal("0.19")
    account.save()
    services.credit_grant(
        actor=None,
        account=account,
        amount=Decimal("10.00"),
        description="Welcome",
        granted_at=at("2025-03-01 00:00"),
    )
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 10:00"))
    invoice = close(lab["a"])
    lines = {line.kind: line.amount for line in invoice.lines.all()}
    usage = lines["usage"]
    assert lines["credits"] == Decimal("-10.00")
    assert lines["tax"] == pricing.to_cents((usage - 10) * Decimal("0.19"))
    assert invoice.total == usage - 10 + lines["tax"]
    assert CreditApplication.objects.get(invoice=invoice).amount == Decimal("10.00")
    # the next month has no credits left
    place(start=at("2025-04-10 00:00"), end=at("2025-04-10 01:00"))
    april = close(lab["a"], period=date(2025, 4, 1), now=at("2025-05-01 01:00"))
    assert not april.lines.filter(kind="credits").exists()
    assert_consistent(april)


def test_fault_credit_line_and_adjustments(lab, place):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 02:00"), end_reason="node_lost")
    place(start=at("2025-03-11 00:00"), end=at("2025-03-11 02:00"))
    account = services.account_open_for_project(project=lab["a"])
    Adjustment.objects.create(account=account, amount=Decimal("-1.50"), description="Goodwill")
    invoice = close(lab["a"])
    lines = {line.kind: line.amount for line in invoice.lines.all()}
    assert lines["fault_credit"] == -lines["usage"] / 2
    assert lines["adjustment"] == Decimal("-1.50")
    assert invoice.total == lines["usage"] / 2 - Decimal("1.50")
    assert_consistent(invoice)


def test_usage_metered_after_its_month_closed_goes_on_the_next_invoice(lab, place):
    close(lab["a"])  # March closed with nothing
    late = place(start=at("2025-03-31 22:00"), end=at("2025-04-01 01:00"))
    april = close(lab["a"], period=date(2025, 4, 1), now=at("2025-05-01 01:00"))
    kinds = {line.kind: line.gpu_hours for line in april.lines.all()}
    assert kinds == {"late_usage": Decimal("2.0000"), "usage": Decimal("1.0000"), "tax": None}
    assert set(UsageRecord.objects.filter(allocation=late).values_list("invoice", flat=True)) == {
        april.pk
    }
    assert_consistent(april)


def test_shared_account_invoices_all_its_projects(lab, place, make_user):
    from billing.models import BillingAccount

    staff = make_user(staff=True)
    shared = BillingAccount.objects.create(name="Shared lab")
    services.project_move_to_account(actor=staff, project=lab["a"], account=shared)
    services.project_move_to_account(actor=staff, project=lab["b"], account=shared)
    place(project=lab["a"], start=at("2025-03-10 00:00"), end=at("2025-03-10 01:00"))
    place(
        project=lab["b"], start=at("2025-03-10 00:00"), end=at("2025-03-10 01:00"), gpu=h100s()[1]
    )
    invoice = services.invoice_close(account_id=shared.pk, period_start=MARCH, now=APRIL_1)
    assert invoice.lines.get(kind="usage").gpu_hours == Decimal("2.0000")
    assert {r["project__slug"] for r in selectors.invoice_job_summary(invoice=invoice)} == {
        "alpha",
        "beta",
    }
    with pytest.raises(DomainError):
        services.project_move_to_account(actor=lab["owner"], project=lab["a"], account=shared)


def test_close_month_lists_each_account_once(lab, place):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 01:00"))
    services.account_open_for_project(project=lab["b"])
    ids = services.invoices_close_month(now=at("2025-04-01 01:00"))
    assert len(ids) == 2
    for account_id in ids:
        services.invoice_close(account_id=account_id, period_start=MARCH, now=APRIL_1)
    assert services.invoices_close_month(now=at("2025-04-01 02:00")) == []
    assert InvoiceLine.objects.filter(invoice__period_start=MARCH).count() == 2  # usage, tax
    assert Invoice.objects.filter(period_start=MARCH).count() == 2  # beta's: nothing to bill
    assert MARCH + timedelta(days=31) == date(2025, 4, 1)
