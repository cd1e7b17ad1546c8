"""The ledger and its invoices: late facts never rewrite an issued invoice, fully credited
usage nets to exactly 0.00, one gapless number sequence, the parties, the tax line, no
invoice for an idle month, the per-job Billable column, and line record counts."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from django.core import mail
from django.db import IntegrityError, transaction

from billing import selectors, services
from billing.models import Adjustment, Invoice, UsageRecord
from billing.services.invoices import invoice_close
from portal.models import AuditEvent
from scheduler.models import Allocation, Gpu
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
MARCH, APRIL = date(2025, 3, 1), date(2025, 4, 1)


def close(project, period=MARCH, now=None):
    account = services.account_open_for_project(project=project)
    now = now or (at("2025-04-01 00:30") if period == MARCH else at("2025-05-01 00:30"))
    return services.invoice_close(account_id=account.pk, period_start=period, now=now)


def h100s():
    return list(Gpu.objects.filter(model__name="H100-80GB-SXM").order_by("pk"))


def test_a_fault_learned_after_the_close_goes_on_the_next_invoice(lab, place):
    alloc = place(start=at("2025-03-31 20:00"))  # running across the close
    march = close(lab["a"])
    march_records = list(
        UsageRecord.objects.filter(invoice=march).values_list("pk", "amount", "fault_credit")
    )
    assert march.total > 0 and len(march_records) == 4
    # the node is lost on 1 April: March's usage was lost work too, but March is issued
    Allocation.objects.filter(pk=alloc.pk).update(
        ended_at=at("2025-04-01 02:00"), end_reason="node_lost"
    )
    services.usage_meter(now=at("2025-04-02 00:00"))
    services.usage_meter(now=at("2025-04-03 00:00"))  # again: corrected once
    after = list(
        UsageRecord.objects.filter(invoice=march).values_list("pk", "amount", "fault_credit")
    )
    assert after == march_records  # the issued invoice's records did not change
    correction = Adjustment.objects.get(source_allocation=alloc)
    assert correction.source_invoice_id == march.pk
    assert correction.amount == -march.lines.get(kind="usage").amount
    april = close(lab["a"], period=APRIL)
    line = april.lines.get(kind="adjustment")
    assert line.adjustment_id == correction.pk and line.amount == correction.amount
    assert april.lines.get(kind="fault_credit").amount == -april.lines.get(kind="usage").amount
    assert AuditEvent.objects.filter(action="billing.adjustment.fault_correction").count() == 1


def test_an_issued_invoice_and_its_records_refuse_changes(lab, place):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 02:00"))
    march = close(lab["a"])
    for change in (
        lambda: UsageRecord.objects.filter(invoice=march).update(fault_credit=True),
        lambda: march.lines.filter(kind="usage").update(amount=Decimal("0.00")),
        lambda: Invoice.objects.filter(pk=march.pk).update(total=Decimal("0.00")),
        lambda: march.lines.filter(kind="tax").delete(),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            change()
    # what may still move: status and payment fields
    Invoice.objects.filter(pk=march.pk).update(status="paid")


def test_fully_credited_usage_bills_exactly_zero(lab, place):
    """Two fault-credited allocations of 0.035 USD each at two rates (36 s at 3.50 and 90 s
    at 1.40 per GPU-hour): rounded per usage line
    they bill 0.04 + 0.04; a credit rounded over both (0.07) left 0.01 billed."""
    gpu = h100s()[0]
    place(
        gpu=gpu,
        start=at("2025-03-10 00:00:00"),
        end=at("2025-03-10 00:00:36"),
        end_reason="node_lost",
    )
    faulted = place(
        gpu=gpu,
        preemptible=True,
        start=at("2025-03-11 00:00:00"),
        end=at("2025-03-11 00:01:30"),
        end_reason="gpu_fault",
    )
    # a GPU fault credits only once corroborated (docs/billing.md): an operator confirmed it
    Allocation.objects.filter(pk=faulted.pk).update(fault_corroborated_at=at("2025-03-11 00:05:00"))
    march = close(lab["a"])
    assert sorted(UsageRecord.objects.values_list("amount", flat=True)) == [
        Decimal("0.035"),
        Decimal("0.035"),
    ]
    usage = [line.amount for line in march.lines.filter(kind__in=["usage", "preemptible"])]
    credits = [line.amount for line in march.lines.filter(kind="fault_credit")]
    assert usage == [Decimal("0.04"), Decimal("0.04")] and credits == [-u for u in usage]
    assert march.total == Decimal("0.00")
    for line in march.lines.filter(kind="fault_credit"):
        assert selectors.line_records(line=line).count() == line.record_count == 1
    # the per-job Billable column shows what is billed: nothing
    assert {row["cost"] for row in selectors.invoice_job_summary(invoice=march)} == {Decimal(0)}


def test_invoice_numbers_are_one_gapless_sequence(lab, place, settings):
    settings.BILLING_ISSUER_ID = "ACME"
    place(project=lab["a"], start=at("2025-03-10 00:00"), end=at("2025-03-10 01:00"))
    place(
        project=lab["b"], gpu=h100s()[1], start=at("2025-03-10 00:00"), end=at("2025-03-10 01:00")
    )
    services.usage_meter(now=at("2025-04-01 00:10"))
    assert Invoice.objects.get(account__project_links__project=lab["a"]).number.startswith("DRAFT-")
    first = close(lab["a"])
    b = services.account_open_for_project(project=lab["b"])
    with pytest.raises(RuntimeError), transaction.atomic():  # a close that rolls back
        invoice_close(account_id=b.pk, period_start=MARCH, now=at("2025-04-01 00:30"))
        raise RuntimeError("worker lost")
    second = close(lab["b"])
    april = close(lab["a"], period=APRIL)  # idle: takes no number
    assert [first.number, second.number] == ["ACME-000001", "ACME-000002"]
    assert april.status == "nothing" and april.number.startswith("DRAFT-")
    place(project=lab["a"], start=at("2025-05-10 00:00"), end=at("2025-05-10 01:00"))
    may = close(lab["a"], period=date(2025, 5, 1), now=at("2025-06-01 00:30"))
    assert may.number == "ACME-000003"


def test_an_idle_month_sends_no_invoice(lab, django_capture_on_commit_callbacks):
    beta = services.account_open_for_project(project=lab["b"])
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        idle = close(lab["a"])
    assert idle.status == "nothing" and not idle.lines.exists() and callbacks == []
    assert services.invoice_send_email(invoice_id=idle.pk) is False and not mail.outbox
    assert not selectors.invoice_list_for_project(project=lab["a"]).exists()
    assert services.invoices_close_month(now=at("2025-04-01 01:00")) == [beta.pk]


def test_parties_tax_line_and_amounts_shown_once(lab, place, settings, client):
    settings.BILLING_SELLER_NAME = "GPU Cloud GmbH"
    settings.BILLING_SELLER_ADDRESS = "Hauptstr. 1, 10115 Berlin"
    settings.BILLING_SELLER_TAX_ID = "DE123456789"
    account = services.account_open_for_project(project=lab["a"])
    account.legal_name, account.tax_id = "Alpha Research Ltd", "GB999999973"
    account.legal_address = "1 Lab Road, Cambridge"
    account.save()
    services.credit_grant(
        actor=None, account=account, amount=Decimal("1.00"), granted_at=at("2025-03-01 00:00")
    )
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 02:00"))
    march = close(lab["a"])
    tax = march.lines.get(kind="tax")
    assert tax.amount == Decimal("0.00") and tax.description == "Tax at 0.00 %"
    assert march.seller["tax_id"] == "DE123456789" and march.buyer["name"] == "Alpha Research Ltd"
    client.force_login(lab["owner"])
    page = client.get(f"/billing/invoices/{march.pk}/").content.decode()
    for text in ("GPU Cloud GmbH", "DE123456789", "Alpha Research Ltd", "GB999999973"):
        assert text in page
    assert page.count("Prepaid credits") == 1 and page.count("Tax at 0.00 %") == 1
    # details are frozen at issue: a later edit of the account does not rewrite the invoice
    account.legal_name = "Renamed"
    account.save()
    assert Invoice.objects.get(pk=march.pk).buyer["name"] == "Alpha Research Ltd"


def test_line_record_counts_count_the_records_behind_each_line(lab, place):
    account = services.account_open_for_project(project=lab["a"])
    services.reserved_plan_create(
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
    march = close(lab["a"])
    covered = march.lines.get(kind="covered")
    usage = march.lines.get(kind="usage")
    records = UsageRecord.objects.filter(invoice=march)
    assert covered.record_count == records.filter(covered_milli_seconds__gt=0).count() == 15
    assert usage.record_count == selectors.line_records(line=usage).count() == 5


def test_an_invoiced_adjustment_is_read_only_in_the_admin(lab, place, client, make_user):
    account = services.account_open_for_project(project=lab["a"])
    adjustment = Adjustment.objects.create(
        account=account, amount=Decimal("-1.50"), description="Goodwill"
    )
    staff = make_user(staff=True)
    staff.is_superuser = True
    staff.save()
    client.force_login(staff)
    url = f"/admin/billing/adjustment/{adjustment.pk}/change/"
    assert 'name="_save"' in client.get(url).content.decode()  # not invoiced yet: editable
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 02:00"))
    close(lab["a"])
    assert 'name="_save"' not in client.get(url).content.decode()
    form = {"account": account.pk, "amount": "-100.00", "description": "Goodwill"}
    assert client.post(url, form).status_code == 403
    assert Adjustment.objects.get(pk=adjustment.pk).amount == Decimal("-1.50")
