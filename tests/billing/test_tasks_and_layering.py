"""Billing tasks take ids and are idempotent; pricing stays pure; only the gateway imports stripe."""

from __future__ import annotations

import ast
from datetime import date
from pathlib import Path

import pytest
from django.core import mail

from billing import services, tasks
from billing.models import Invoice, UsageRecord
from tests.billing.conftest import at

ROOT = Path(__file__).resolve().parents[2]


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_pricing_is_pure_and_stripe_stays_in_the_gateway():
    # the standard library, and the scheduler core's rules (pure too: test_architecture)
    tree = ast.parse((ROOT / "billing" / "pricing.py").read_text())
    ours = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in ours if m.startswith("scheduler")} <= {"scheduler.core.periods"}
    assert imports_of(ROOT / "billing" / "pricing.py") - {"scheduler"} <= {
        "__future__",
        "collections",
        "dataclasses",
        "datetime",
        "decimal",
        "itertools",
        "typing",
    }
    for path in (ROOT / "billing").rglob("*.py"):
        if path.name != "gateway.py" and "migrations" not in path.parts:
            assert "stripe" not in imports_of(path), path


@pytest.mark.django_db
def test_tasks_are_idempotent(lab, place, monkeypatch):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 03:00"))
    monkeypatch.setattr("django.utils.timezone.now", lambda: at("2025-04-01 00:20"))
    assert tasks.meter.apply().get() == 3
    assert tasks.meter.apply().get() == 0
    assert UsageRecord.objects.count() == 3
    account = services.account_open_for_project(project=lab["a"])
    first = tasks.close_account.apply(args=(account.pk, "2025-03-01")).get()
    again = tasks.close_account.apply(args=(account.pk, "2025-03-01", False)).get()
    assert first == again and Invoice.objects.exclude(status="draft").count() == 1
    assert tasks.send_invoice_email.apply(args=(first,)).get() is True
    assert tasks.send_invoice_email.apply(args=(first,)).get() is False
    assert len(mail.outbox) == 1 and mail.outbox[0].attachments
    assert tasks.push_invoice_to_stripe.apply(args=(first,)).get() == "stripe disabled"
    assert tasks.check_budgets.apply().get() == 0
    assert services.invoices_close_month(period_start=date(2025, 3, 1)) == []
