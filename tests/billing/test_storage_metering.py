"""Storage metering: volumes' size limits × time in GB-months, priced from the storage price
list, on the usage page, the invoice and the FOCUS export (as Storage, not GPU)."""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from billing import services
from billing.documents import invoice_context
from billing.models import BudgetAlert, StoragePrice, StorageUsageRecord
from billing.selectors import project_burn_per_hour, project_spend, usage_summary
from billing.services.storage_metering import storage_meter
from portal.errors import DomainError
from portal.models import AuditEvent, User
from scheduler.models import Gpu
from storage import services as storage_services
from storage.models import Volume, VolumeKind
from tests.billing.conftest import at
from tests.billing.test_focus import export, focus_errors, total

pytestmark = pytest.mark.django_db
APRIL = date(2025, 4, 1)


def volume(project, name, *, kind=VolumeKind.SHARED, size=100, created, deleted=None, **extra):
    made = Volume.objects.create(project=project, name=name, kind=kind, size_gib=size, **extra)
    # created_at is auto_now_add: set the times the test speaks of
    Volume.objects.filter(pk=made.pk).update(
        created_at=created, deleted_at=deleted, state="deleted" if deleted else "active"
    )
    return Volume.objects.get(pk=made.pk)


def test_size_limit_times_time_priced_per_gb_month_once_and_to_the_last_whole_hour(lab):
    a = lab["a"]
    data = volume(a, "data", created=at("2025-04-10 10:30"), deleted=at("2025-04-12 10:30"))
    volume(a, "tmp", kind=VolumeKind.SCRATCH, created=at("2025-04-10 00:00"))  # not metered
    ds = volume(a, "ds", size=10, is_dataset=True, created=at("2025-04-20 00:00"))
    assert storage_meter(now=at("2025-04-20 05:59:59")) > 0
    # the running dataset is metered to 05:00, the last whole hour
    assert StorageUsageRecord.objects.filter(volume=ds).count() == 5
    assert storage_meter(now=at("2025-04-20 05:59:59")) == 0  # again: nothing twice
    storage_meter(now=at("2025-05-01 00:30"))
    records = StorageUsageRecord.objects.filter(volume=data)
    assert sum(r.gib_seconds for r in records) == 100 * 48 * 3600
    price = StoragePrice.objects.get()
    assert price.per_gib_month == Decimal("0.1000")  # the default price of the migration
    # 100 GiB for 48 of a GB-month's 730 hours at 0.10
    expected = Decimal(100 * 48) * Decimal("0.10") / 730
    assert abs(sum(r.amount for r in records) - expected) < Decimal("0.00005")
    assert not StorageUsageRecord.objects.filter(volume__kind=VolumeKind.SCRATCH).exists()
    # the dataset counts once for the rest of April, whatever mounts it
    ds_records = StorageUsageRecord.objects.filter(volume=ds, period_start=APRIL)
    assert sum(r.gib_seconds for r in ds_records) == 10 * (11 * 24) * 3600
    storage_meter(now=at("2025-05-01 02:10"))  # the month boundary cuts: May's own slices
    may = StorageUsageRecord.objects.filter(volume=ds, period_start=date(2025, 5, 1))
    assert [r.slice_start for r in may] == [at("2025-05-01 00:00"), at("2025-05-01 01:00")]


def test_a_price_change_cuts_the_slices(lab):
    a = lab["a"]
    storage_meter(now=at("2025-01-01 00:00"))  # seeds the default price
    StoragePrice.objects.create(effective_from=at("2025-04-10 12:30"), per_gib_month=Decimal("1"))
    v = volume(a, "v", size=1, created=at("2025-04-10 12:00"), deleted=at("2025-04-10 13:00"))
    storage_meter(now=at("2025-04-11 00:00"))
    rows = list(StorageUsageRecord.objects.filter(volume=v).order_by("slice_start"))
    assert [(r.slice_start, r.slice_end, r.rate) for r in rows] == [
        (at("2025-04-10 12:00"), at("2025-04-10 12:30"), Decimal("0.1000")),
        (at("2025-04-10 12:30"), at("2025-04-10 13:00"), Decimal("1.0000")),
    ]


def test_storage_on_the_usage_page_the_invoice_and_the_focus_export(
    lab, client, tmp_path, monkeypatch
):
    a = lab["a"]
    account = services.account_open_for_project(project=a)
    volume(a, "ckpt", size=730, created=at("2025-04-01 00:00"))
    volume(a, "corpus", size=73, is_dataset=True, created=at("2025-04-15 00:00"))
    storage_meter(now=at("2025-04-16 00:00"))
    summary = usage_summary(project=a, period_start=APRIL, now=at("2025-04-16 00:00"))
    rows = {r.volume: r for r in summary.by_volume}
    # 730 GiB for 15 days = 360 h: 360 GB-months... at 0.10: 36.00; the dataset 24 h: 0.24
    assert rows["ckpt"].gb_months == Decimal("360.0000") and rows["ckpt"].amount == Decimal("36.00")
    assert rows["corpus"].kind == "dataset" and rows["corpus"].amount == Decimal("0.24")
    assert summary.storage == Decimal("36.24") and summary.metered == Decimal("36.24")
    client.force_login(lab["viewer"])
    page = client.get("/billing/projects/alpha/usage/?month=2025-04")
    assert page.status_code == 200 and b'data-testid="by-volume"' in page.content
    assert b"corpus" in page.content
    api = client.get("/api/v1/billing/projects/alpha/usage?month=2025-04").json()
    assert api["storage"] == "36.24" and [v["volume"] for v in api["by_volume"]] == [
        "ckpt",
        "corpus",
    ]

    invoice = services.invoice_close(
        account_id=account.pk, period_start=APRIL, now=at("2025-05-01 00:30")
    )
    line = invoice.lines.get(kind="storage")
    # the whole month: ckpt 720 h × 730 GiB / 730 = 720 GB-months, corpus 384 h × 73 / 730
    assert line.amount == Decimal("72.00") + Decimal("3.84")
    assert "758.4000 GB-months" in line.description
    assert invoice.subtotal == line.amount

    client.force_login(lab["owner"])
    text, focus = export(client, invoice)
    path = tmp_path / "april.csv"
    path.write_text(text)
    assert focus_errors(path, monkeypatch) == []
    assert total(focus) == invoice.total
    storage_rows = [r for r in focus if r["ServiceCategory"] == "Storage"]
    assert {r["ResourceName"] for r in storage_rows} == {"alpha/ckpt", "alpha/corpus"}
    assert {r["ConsumedUnit"] for r in storage_rows} == {"GB-Months"}
    assert all(r["ResourceType"] == "Volume" for r in storage_rows)
    # no GPU here: every cent is storage (the tax row, at 0 %, bills nothing)
    assert total(storage_rows) == invoice.total
    assert not [r for r in focus if r["ResourceType"] == "GPU"]


def focus_of_month(client, slug: str, month: str) -> tuple[str, list[dict[str, str]]]:
    response = client.get(f"/billing/projects/{slug}/focus.csv?month={month}")
    text = b"".join(response.streaming_content).decode()
    return text, list(csv.DictReader(io.StringIO(text)))


def test_the_open_months_focus_export_lists_storage_and_adds_up_to_the_invoice(
    lab, place, client, tmp_path, monkeypatch
):
    """Mid-month, a finance person's FOCUS export holds storage rows (Storage, GB-Months)
    beside the GPU rows; they pass focus-validator, they sum to what the usage page shows,
    and once the month is invoiced the issued invoice's rows are the same rows."""
    a = lab["a"]
    account = services.account_open_for_project(project=a)
    place(start=at("2025-04-03 00:00:00"), end=at("2025-04-03 02:17:13"))
    volume(a, "ckpt", size=50, created=at("2025-04-02 00:00"), deleted=at("2025-04-12 00:00"))
    volume(
        a,
        "corpus",
        size=7,
        is_dataset=True,
        created=at("2025-04-05 00:00"),
        deleted=at("2025-04-12 00:00"),
    )
    volume(lab["b"], "theirs", size=500, created=at("2025-04-02 00:00"))  # another project
    now = at("2025-04-16 00:00")
    services.usage_meter(now=now)
    storage_meter(now=now)

    client.force_login(lab["owner"])
    text, rows = focus_of_month(client, "alpha", "2025-04")
    path = tmp_path / "open.csv"
    path.write_text(text)
    assert focus_errors(path, monkeypatch) == []
    storage_rows = [r for r in rows if r["ServiceCategory"] == "Storage"]
    gpu_rows = [r for r in rows if r["ServiceCategory"] == "Compute"]
    assert gpu_rows and len(gpu_rows) + len(storage_rows) == len(rows)
    assert {r["ResourceName"] for r in storage_rows} == {"alpha/ckpt", "alpha/corpus"}
    assert {r["ConsumedUnit"] for r in storage_rows} == {"GB-Months"}
    assert {r["ResourceType"] for r in storage_rows} == {"Volume"}
    # ckpt: 50 GiB × 240 h / 730; corpus: 7 GiB × 168 h / 730
    quantity = {r["ResourceName"]: Decimal(r["ConsumedQuantity"]) for r in storage_rows}
    assert quantity["alpha/ckpt"] == (Decimal(50 * 240) / 730).quantize(Decimal("1e-10"))
    assert quantity["alpha/corpus"] == (Decimal(7 * 168) / 730).quantize(Decimal("1e-10"))
    summary = usage_summary(project=a, period_start=APRIL, now=now)
    assert total(storage_rows).quantize(Decimal("0.01")) == summary.storage
    assert total(rows).quantize(Decimal("0.01")) == summary.metered.quantize(Decimal("0.01"))

    invoice = services.invoice_close(
        account_id=account.pk, period_start=APRIL, now=at("2025-05-01 00:30")
    )
    _, issued = export(client, invoice)
    issued_storage = [
        r for r in issued if r["ServiceCategory"] == "Storage" and r["ChargeCategory"] == "Usage"
    ]
    assert sorted((r["ResourceName"], r["BilledCost"]) for r in issued_storage) == sorted(
        (r["ResourceName"], r["BilledCost"]) for r in storage_rows
    )
    assert total(issued) == invoice.total
    assert abs(total(rows) - invoice.subtotal) < Decimal("0.01")


def test_a_dataset_mounted_by_many_jobs_is_billed_once_per_slice(lab, place):
    """Mounts are not what is metered: one record per dataset and hour slice, whatever runs,
    and metering again (by project, by everything, at the close) never adds a second."""
    a = lab["a"]
    account = services.account_open_for_project(project=a)
    ds = volume(a, "imagenet", size=150, is_dataset=True, created=at("2025-04-10 00:00"))
    for gpu in Gpu.objects.filter(model=lab["h100"]).order_by("pk")[:4]:
        place(gpu=gpu, start=at("2025-04-10 00:00"), end=at("2025-04-10 06:00"))
    storage_meter(now=at("2025-04-10 03:00"), project_ids=[a.pk])
    storage_meter(now=at("2025-04-10 03:30"))
    storage_meter(now=at("2025-04-10 06:00"), project_ids=[a.pk])
    storage_meter(now=at("2025-04-10 06:00"))
    records = list(StorageUsageRecord.objects.filter(volume=ds).order_by("slice_start"))
    assert [r.slice_start for r in records] == [at(f"2025-04-10 0{h}:00") for h in range(6)]
    assert {r.gib_seconds for r in records} == {150 * 3600}
    invoice = services.invoice_close(
        account_id=account.pk, period_start=APRIL, now=at("2025-05-01 00:30")
    )
    line = invoice.lines.get(kind="storage")
    # 150 GiB for the 504 h from April 10 to May 1, once: 150 × 504 / 730 GB-months at 0.10
    assert line.amount == (Decimal(150 * 504) * Decimal("0.10") / 730).quantize(Decimal("0.01"))
    assert StorageUsageRecord.objects.filter(volume=ds, period_start=APRIL).count() == 504


def test_a_deleted_volume_is_metered_to_its_deletion_and_no_further(lab):
    """Deleted through the storage service (which stamps the moment): metered to that second,
    then never again, however often metering runs later."""
    a = lab["a"]
    now = timezone.now()
    created = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=5)
    v = volume(a, "scratchpad", size=20, created=created)
    storage_meter(now=now)
    storage_services.volume_delete(actor=lab["owner"], project=a, volume_id=v.pk)
    deleted_at = Volume.objects.get(pk=v.pk).deleted_at
    assert deleted_at is not None
    for later in (1, 3, 48):
        storage_meter(now=deleted_at + timedelta(hours=later))
    records = list(StorageUsageRecord.objects.filter(volume=v).order_by("slice_start"))
    assert records[-1].slice_end == deleted_at.replace(microsecond=0)
    seconds = int((deleted_at.replace(microsecond=0) - created).total_seconds())
    assert sum(r.gib_seconds for r in records) == 20 * seconds
    assert not StorageUsageRecord.objects.filter(volume=v, slice_end__gt=deleted_at).exists()


def test_storage_counts_toward_the_budget_its_alerts_and_the_hard_cap(lab, place):
    """Storage is billed, so it is spend: the budget's figures, its threshold alerts and the
    hard cap count it with GPU time (a project that only holds volumes reaches its budget)."""
    a = lab["a"]
    services.account_open_for_project(project=a)
    now = at("2025-04-16 00:00")
    # 730 GiB for 15 days (360 h) at 0.10 per GB-month: 36.00 of storage, no GPU at all
    volume(a, "ckpt", size=730, created=at("2025-04-01 00:00"))
    storage_meter(now=now)
    services.budget_set(actor=lab["owner"], project=a, monthly_amount=Decimal("40.00"))
    assert project_spend(project_ids={a.pk}, now=now)[a.pk] == Decimal("36.00")
    assert [x.threshold for x in services.budgets_check(now=now)] == [80]
    alert = BudgetAlert.objects.get(project=a, threshold=80)
    assert alert.spent == Decimal("36.00")
    summary = usage_summary(project=a, period_start=APRIL, now=now)
    assert summary.to_date == Decimal("36.00") and summary.budget_percent == 90
    # the burn rate counts the held volume: 730 GiB × 0.10 / 730 h = 0.10 an hour
    assert project_burn_per_hour(project_id=a.pk, now=now) == Decimal("0.10")
    assert summary.burn_per_hour == Decimal("0.10")

    # with a hard cap, storage pushes the project over: its GPU job is stopped
    running = place(start=at("2025-04-15 00:00"))
    services.budget_set(
        actor=lab["owner"], project=a, monthly_amount=Decimal("30.00"), hard_cap=True
    )
    result = services.budget_caps_enforce(now=now)
    assert result.stopped == [running.job_id]


def test_invoice_page_pdf_and_email_show_storage_in_gb_months(lab, place, client, mailoutbox):
    """Storage on the invoice documents is storage: GB-months at a price per GB-month (never
    GPU-hours or "/GPU-h"), and a by-volume table beside the by-job one."""
    a = lab["a"]
    account = services.account_open_for_project(project=a)
    place(start=at("2025-04-10 00:00"), end=at("2025-04-10 05:00"))
    volume(a, "ckpt", size=730, created=at("2025-04-01 00:00"), deleted=at("2025-04-11 00:00"))
    invoice = services.invoice_close(
        account_id=account.pk, period_start=APRIL, now=at("2025-05-01 00:30")
    )
    line = invoice.lines.get(kind="storage")
    assert line.amount == Decimal("24.00")  # 730 GiB × 240 h / 730 at 0.10
    html = render_to_string("billing/invoice_pdf.html", invoice_context(invoice))
    assert "240.0000 GB-months" in html and "$0.1000/GB-month" in html
    assert 'data-testid="invoice-volumes"' in html and "ckpt" in html
    assert "/GPU-h" in html  # the GPU line keeps its unit
    client.force_login(lab["owner"])
    page = client.get(f"/billing/invoices/{invoice.pk}/").content.decode()
    assert "240.0000 GB-months" in page and 'data-testid="invoice-volumes"' in page
    assert services.invoice_send_email(invoice_id=invoice.pk) is True
    text = mailoutbox[0].body
    storage_line = next(t for t in text.splitlines() if t.startswith(f"{line.position}. "))
    assert "240.0000 GB-months @ $0.1000/GB-month: $24.00" in storage_line
    assert "GPU-h" not in storage_line
    html_mail = mailoutbox[0].alternatives[0][0]
    assert "240.0000 GB-months" in html_mail


def test_the_usage_csv_lists_storage_rows_that_add_up_with_gpu(lab, place, client):
    a = lab["a"]
    services.account_open_for_project(project=a)
    place(start=at("2025-04-10 00:00"), end=at("2025-04-10 02:00"))
    volume(a, "ckpt", size=73, created=at("2025-04-10 00:00"), deleted=at("2025-04-10 10:00"))
    volume(lab["b"], "theirs", size=9, created=at("2025-04-10 00:00"))  # not alpha's
    now = at("2025-04-16 00:00")
    services.usage_meter(now=now)
    storage_meter(now=now)
    client.force_login(lab["viewer"])
    body = client.get("/billing/projects/alpha/usage.csv?month=2025-04").streaming_content
    rows = list(csv.DictReader(io.StringIO(b"".join(body).decode())))
    storage_rows = [r for r in rows if r["kind"] == "storage"]
    assert {r["volume"] for r in storage_rows} == {"ckpt"} and len(storage_rows) == 10
    assert {r["gpu_model"] for r in storage_rows} == {""}
    # 73 GiB × 10 h = 1 GB-month at 0.10
    assert sum(Decimal(r["gb_months"]) for r in storage_rows) == Decimal("1.0000")
    assert {r["kind"] for r in rows} == {"gpu", "storage"}
    summary = usage_summary(project=a, period_start=APRIL, now=now)
    assert sum(Decimal(r["amount"]) for r in rows).quantize(Decimal("0.01")) == summary.metered


def test_the_storage_price_is_listed_and_operators_publish_new_versions_only(lab, client):
    """Like GPU prices: the API lists the price per GB-month in effect and scheduled ones; an
    operator adds a version from now on in the admin; one in effect cannot be edited or
    deleted, and a start in the past is a form error naming the field."""
    storage_meter(now=at("2025-01-01 00:00"))  # seeds the default price
    seeded = StoragePrice.objects.get()
    later = timezone.now() + timedelta(days=3)
    services.storage_price_publish(
        actor=None, effective_from=later, per_gib_month=Decimal("0.08"), note="cheaper"
    )
    with pytest.raises(DomainError) as past:
        services.storage_price_publish(
            actor=None, effective_from=at("2025-01-02 00:00"), per_gib_month=Decimal("1")
        )
    assert past.value.field == "effective_from"
    client.force_login(lab["viewer"])
    listed = client.get("/api/v1/billing/prices/storage").json()
    assert [p["per_gib_month"] for p in listed] == ["0.1000", "0.0800"]

    staff = User.objects.create_user("op@example.com", "x")
    User.objects.filter(pk=staff.pk).update(is_staff=True, is_superuser=True)
    client.force_login(User.objects.get(pk=staff.pk))
    base = "/admin/billing/storageprice/"
    # the version in effect cannot be edited or deleted
    assert client.post(f"{base}{seeded.pk}/change/", {}).status_code == 403
    assert client.post(f"{base}{seeded.pk}/delete/", {"post": "yes"}).status_code == 403
    refused = client.post(
        f"{base}add/",
        {
            "effective_from_0": "2025-01-05",
            "effective_from_1": "00:00:00",
            "per_gib_month": "0.2",
            "note": "back-dated",
        },
    )
    assert refused.status_code == 200 and b"cannot take effect in the past" in refused.content
    future = timezone.now() + timedelta(days=10)
    added = client.post(
        f"{base}add/",
        {
            "effective_from_0": f"{future:%Y-%m-%d}",
            "effective_from_1": "00:00:00",
            "per_gib_month": "0.2",
            "note": "dearer",
        },
    )
    assert added.status_code == 302
    assert StoragePrice.objects.filter(per_gib_month=Decimal("0.2")).exists()
    assert AuditEvent.objects.filter(action="admin.storageprice.add").exists()
    assert AuditEvent.objects.filter(action="billing.storage_price.publish").exists()
    assert StoragePrice.objects.get(pk=seeded.pk).per_gib_month == Decimal("0.1000")
