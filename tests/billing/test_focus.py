"""The FOCUS export reconciles with the invoice it comes from, row by row and in total, and
passes the FinOps Foundation's `focus-validator` (FOCUS 1.0) with zero errors."""

from __future__ import annotations

import csv
import io
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy
import pytest

from billing import services
from billing.models import Adjustment, Invoice
from scheduler.models import Allocation, Gpu
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
MARCH, APRIL = date(2025, 3, 1), date(2025, 4, 1)


def focus_errors(path: Path, monkeypatch) -> list[str]:
    """Every check of focus-validator's FOCUS 1.0 rule set that did not pass."""
    # pandera 0.17 (which focus-validator 1.0.0 pins) still reads two names numpy 2 removed
    for old, new in {"string_": "bytes_", "float_": "float64"}.items():
        if old not in numpy.__dict__:
            setattr(numpy, old, getattr(numpy, new))
    import focus_validator
    from focus_validator.config_objects.common import ChecklistObjectStatus
    from focus_validator.validator import Validator

    # it reads its currency list from a path relative to the working directory
    monkeypatch.chdir(Path(focus_validator.__file__).parent.parent)
    validator = Validator(
        data_filename=str(path), output_destination=None, output_type="console", rules_version="1.0"
    )
    validator.load()
    result = validator.spec_rules.validate(validator.focus_data)
    return [
        f"{check_id}: {item.error or item.friendly_name}"
        for check_id, item in result.checklist.items()
        if item.status in (ChecklistObjectStatus.FAILED, ChecklistObjectStatus.ERRORED)
    ]


def export(client, invoice: Invoice) -> tuple[str, list[dict[str, str]]]:
    body = b"".join(client.get(f"/billing/invoices/{invoice.pk}/focus.csv").streaming_content)
    text = body.decode()
    return text, list(csv.DictReader(io.StringIO(text)))


def total(rows, column="BilledCost") -> Decimal:
    return sum((Decimal(r[column]) for r in rows), Decimal(0))


@pytest.fixture
def months(lab, place):
    """March with a running allocation across the close; April with reserved capacity
    (covered and overage), preemptible work, a same-month fault, prepaid credits, 19 % tax,
    an adjustment, and March's fault learned late."""
    h100 = list(Gpu.objects.filter(model__name="H100-80GB-SXM").order_by("pk"))
    account = services.account_open_for_project(project=lab["a"])
    account.tax_rate = Decimal("0.19")
    account.save()
    running = place(gpu=h100[3], start=at("2025-03-31 20:00:00"))
    place(gpu=h100[0], start=at("2025-03-02 00:00:00"), end=at("2025-03-02 01:17:13"))
    march = services.invoice_close(
        account_id=account.pk, period_start=MARCH, now=at("2025-04-01 00:30")
    )
    Allocation.objects.filter(pk=running.pk).update(
        ended_at=at("2025-04-01 03:00:00"), end_reason="node_lost"
    )
    services.reserved_plan_create(
        actor=None,
        account=account,
        gpu_model=lab["h100"],
        gpus=1,
        term_months=12,
        starts_at=at("2025-04-01 00:00"),
    )
    place(gpu=h100[0], start=at("2025-04-10 00:00:00"), end=at("2025-04-10 10:00:07"))
    place(gpu=h100[1], start=at("2025-04-10 05:00:00"), end=at("2025-04-10 15:33:21"), share=500)
    place(
        gpu=h100[2],
        preemptible=True,
        start=at("2025-04-10 06:00:00"),
        end=at("2025-04-10 08:00:01"),
    )
    place(
        gpu=h100[3],
        start=at("2025-04-10 07:00:00"),
        end=at("2025-04-10 10:00:00"),
        end_reason="gpu_fault",
    )
    services.credit_grant(
        actor=None, account=account, amount=Decimal("5.00"), granted_at=at("2025-04-01 00:00")
    )
    Adjustment.objects.create(account=account, amount=Decimal("2.50"), description="Support hours")
    april = services.invoice_close(
        account_id=account.pk, period_start=APRIL, now=at("2025-05-01 00:30")
    )
    return {"march": march, "april": april, "owner": lab["owner"]}


def test_focus_reconciles_with_the_invoice_and_validates(months, client, tmp_path, monkeypatch):
    client.force_login(months["owner"])
    april = months["april"]
    kinds = set(april.lines.values_list("kind", flat=True))
    assert {
        "reserved_fee",
        "covered",
        "usage",
        "preemptible",
        "fault_credit",
        "adjustment",
        "credits",
        "tax",
    } <= kinds
    text, rows = export(client, april)
    path = tmp_path / "april.csv"
    path.write_text(text)
    assert focus_errors(path, monkeypatch) == []
    # the sums are the invoice's: billed, and effective (reserved fees spread, none lost)
    assert total(rows) == april.total
    assert total(rows, "EffectiveCost") == april.total
    by_category = {}
    for r in rows:
        by_category.setdefault(r["ChargeCategory"], []).append(r)
    assert total(by_category["Purchase"]) == april.lines.get(kind="reserved_fee").amount
    assert total(by_category["Tax"]) == april.tax
    # same-month fault credits are credits, not corrections; the late one is a correction
    fault = [r for r in by_category["Credit"] if "fault" in r["ChargeDescription"]]
    assert fault and {r["ChargeClass"] for r in fault} == {""}
    corrections = [r for r in rows if r["ChargeClass"] == "Correction"]
    assert len(corrections) == 1 and corrections[0]["x_Corrects"].startswith(
        f"invoice-{months['march'].pk}/allocation-"
    )
    # reserved usage carries its share of the fee; commitment columns are filled
    covered = [r for r in rows if r["CommitmentDiscountStatus"] == "Used"]
    assert covered and all(Decimal(r["EffectiveCost"]) > Decimal(r["BilledCost"]) for r in covered)
    assert all(
        r["CommitmentDiscountId"].startswith("reserved-plan-")
        and r["CommitmentDiscountType"]
        and r["CommitmentDiscountCategory"] == "Usage"
        and r["PricingCategory"] == "Committed"
        for r in covered
    )
    # quantities are not rounded: unit price × quantity = cost
    usage = by_category["Usage"]
    for r in usage:
        if r["PricingQuantity"] and r["ListUnitPrice"]:
            q = Decimal(r["PricingQuantity"])
            for price, cost in (
                ("ListUnitPrice", "ListCost"),
                ("ContractedUnitPrice", "ContractedCost"),
            ):
                assert (Decimal(r[price]) * q).quantize(
                    Decimal("0.000001"), ROUND_HALF_UP
                ) == Decimal(r[cost])
    assert any(len(r["PricingQuantity"].split(".")[1]) > 4 for r in usage if r["PricingQuantity"])
    # ids are stable strings
    again = export(client, april)[0]
    assert again == text
    assert rows[0]["BillingAccountId"] == f"account-{april.account_id}"


def test_an_issued_months_export_still_matches_its_invoice_after_late_facts(months, client):
    """The late fault on March's usage did not rewrite March: its export still sums to it."""
    client.force_login(months["owner"])
    march = months["march"]
    assert march.total > 0
    _, rows = export(client, march)
    assert total(rows) == Invoice.objects.get(pk=march.pk).total == march.total
    project = client.get("/billing/projects/alpha/focus.csv?month=2025-03")
    assert b"".join(project.streaming_content).decode() == export(client, march)[0]
