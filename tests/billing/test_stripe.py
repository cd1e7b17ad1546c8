"""Stripe: the real `stripe` library against a local fake API, idempotency keys from ledger
ids, retries that resume, and webhooks signed with the library's own helper."""

from __future__ import annotations

import itertools
import json
import threading
import time
from datetime import date, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

import pytest
import stripe
from django.core import mail
from django.db import transaction
from django.utils import timezone

from billing import gateway, services, tasks
from billing.models import Adjustment, BillingAccount, Invoice, Notification, StripeEvent
from config.celery import app
from portal.models import AuditEvent
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
WHSEC = "whsec_test_secret"


class FakeStripe(BaseHTTPRequestHandler):
    """Enough of the Stripe API for invoicing: answers by path, replays by Idempotency-Key."""

    calls: list[dict] = []
    replies: dict[str, tuple[int, bytes]] = {}
    fail_next: list[str] = []
    ids = itertools.count(1)

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        params = dict(parse_qsl(self.rfile.read(length).decode()))
        key = self.headers.get("Idempotency-Key", "")
        auth = self.headers.get("Authorization", "")
        type(self).calls.append({"path": self.path, "params": params, "key": key, "auth": auth})
        if key in self.replies:
            status, body = self.replies[key]
        elif self.fail_next and self.path.startswith(self.fail_next[0]):
            self.fail_next.pop(0)
            status, body = (
                402,
                json.dumps(
                    {"error": {"type": "card_error", "message": "Your card was declined."}}
                ).encode(),
            )
        else:
            status, body = 200, json.dumps(self.answer(params)).encode()
            if key:
                self.replies[key] = (status, body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def answer(self, params):
        n = next(self.ids)
        if self.path == "/v1/customers":
            return {"id": f"cus_{n}", "object": "customer", "name": params.get("name")}
        if self.path == "/v1/invoices":
            return {"id": f"in_{n}", "object": "invoice", "status": "draft"}
        if self.path == "/v1/invoiceitems":
            return {"id": f"ii_{n}", "object": "invoiceitem", "amount": int(params["amount"])}
        if self.path.endswith("/finalize"):
            return {"id": self.path.split("/")[3], "object": "invoice", "status": "open"}
        return {"id": f"x_{n}", "object": "unknown"}


@pytest.fixture
def fake_stripe(settings):
    FakeStripe.calls, FakeStripe.replies, FakeStripe.fail_next = [], {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeStripe)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.STRIPE_SECRET_KEY = "sk_test_local"
    settings.STRIPE_API_BASE = f"http://127.0.0.1:{server.server_port}"
    settings.STRIPE_WEBHOOK_SECRET = WHSEC
    yield FakeStripe
    server.shutdown()
    server.server_close()


@pytest.fixture
def invoice(lab, place):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 05:00"))
    place(start=at("2025-03-11 00:00"), end=at("2025-03-11 01:00"), preemptible=True)
    account = services.account_open_for_project(project=lab["a"])
    return services.invoice_close(
        account_id=account.pk, period_start=date(2025, 3, 1), now=at("2025-04-01 01:00")
    )


def test_stripe_is_off_without_a_key(invoice, settings):
    settings.STRIPE_SECRET_KEY = ""
    assert not gateway.enabled()
    assert services.invoice_push_to_stripe(invoice_id=invoice.pk) == "stripe disabled"


def test_push_creates_customer_items_and_finalizes_with_ledger_keys(invoice, fake_stripe):
    stripe_id = services.invoice_push_to_stripe(invoice_id=invoice.pk)
    paths = [c["path"] for c in fake_stripe.calls]
    assert paths == [
        "/v1/customers",
        "/v1/invoices",
        "/v1/invoiceitems",
        "/v1/invoiceitems",
        f"/v1/invoices/{stripe_id}/finalize",
    ]
    keys = [c["key"] for c in fake_stripe.calls]
    lines = list(invoice.lines.exclude(amount=0).order_by("position"))  # 0 % tax: no item
    assert keys == [
        f"gpc-account-{invoice.account_id}-customer",
        f"gpc-invoice-{invoice.pk}",
        *(f"gpc-invoice-line-{line.pk}" for line in lines),
        f"gpc-invoice-{invoice.pk}-finalize",
    ]
    items = [c["params"] for c in fake_stripe.calls if c["path"] == "/v1/invoiceitems"]
    assert [int(i["amount"]) for i in items] == [int(line.amount * 100) for line in lines]
    assert all(i["invoice"] == stripe_id for i in items)
    created = fake_stripe.calls[1]["params"]
    assert created["metadata[ledger_invoice_id]"] == str(invoice.pk)
    assert created["number"] == invoice.number  # Stripe's invoice carries our number
    assert all(c["auth"] == "Bearer sk_test_local" for c in fake_stripe.calls)
    row = Invoice.objects.get(pk=invoice.pk)
    assert row.stripe_finalized and row.stripe_invoice_id == stripe_id
    # pushing again calls nothing
    services.invoice_push_to_stripe(invoice_id=invoice.pk)
    assert len(fake_stripe.calls) == 5


def test_a_failed_push_resumes_without_duplicates(invoice, fake_stripe):
    fake_stripe.fail_next.append("/v1/invoiceitems")
    with pytest.raises(gateway.GatewayError, match="declined"):
        services.invoice_push_to_stripe(invoice_id=invoice.pk)
    # a retry where the first answer was lost: the customer id was not saved
    BillingAccount.objects.filter(pk=invoice.account_id).update(stripe_customer_id="")
    services.invoice_push_to_stripe(invoice_id=invoice.pk)
    successful = {c["key"] for c in fake_stripe.calls}
    customers = {json.loads(fake_stripe.replies[k][1])["id"] for k in successful if "customer" in k}
    assert len(customers) == 1  # the same idempotency key returned the same customer
    item_keys = [c["key"] for c in fake_stripe.calls if c["path"] == "/v1/invoiceitems"]
    assert len(set(item_keys)) == invoice.lines.exclude(amount=0).count()
    assert sum(1 for c in fake_stripe.calls if c["path"].endswith("/finalize")) == 1


def post_event(client, event: dict, *, secret: str = WHSEC, timestamp: int | None = None):
    payload = json.dumps(event)
    header = stripe.WebhookSignature.generate_signature_header(payload, secret, timestamp=timestamp)
    return client.post(
        "/billing/stripe/webhook/",
        data=payload,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=header,
    )


def event(
    kind: str,
    invoice: Invoice,
    *,
    created: int,
    event_id: str | None = None,
    amount_paid: int | None = None,
    currency: str = "usd",
) -> dict:
    paid = int(invoice.total * 100) if amount_paid is None else amount_paid
    return {
        "id": event_id or f"evt_{kind}_{created}",
        "object": "event",
        "type": kind,
        "created": created,
        "data": {
            "object": {
                "id": invoice.stripe_invoice_id or "in_unknown",
                "object": "invoice",
                "amount_paid": paid if kind in services.PAID_EVENTS else 0,
                "currency": currency,
                "metadata": {"ledger_invoice_id": str(invoice.pk)},
            }
        },
    }


def test_webhook_verifies_signatures(invoice, fake_stripe, client):
    bad = post_event(client, event("invoice.paid", invoice, created=100), secret="whsec_wrong")
    assert bad.status_code == 400 and "Signature" in bad.json()["detail"]
    stale = post_event(
        client,
        event("invoice.paid", invoice, created=100),
        timestamp=int(time.time()) - 3600,
    )
    assert stale.status_code == 400
    unsigned = client.post("/billing/stripe/webhook/", data="{}", content_type="application/json")
    assert unsigned.status_code == 400
    assert Invoice.objects.get(pk=invoice.pk).status == "open"
    assert not StripeEvent.objects.exists()
    assert client.get("/billing/stripe/webhook/").status_code == 405


def test_paid_and_duplicate_delivery(invoice, fake_stripe, client):
    paid = event("invoice.paid", invoice, created=300, event_id="evt_1")
    assert post_event(client, paid).json()["outcome"] == "paid"
    assert post_event(client, paid).json()["outcome"] == "duplicate"
    assert StripeEvent.objects.count() == 1
    row = Invoice.objects.get(pk=invoice.pk)
    assert row.status == "paid" and row.paid_at is not None


def test_out_of_order_delivery_never_undoes_a_newer_state(invoice, fake_stripe, client):
    assert (
        post_event(client, event("invoice.paid", invoice, created=300)).json()["outcome"] == "paid"
    )
    late = post_event(client, event("invoice.payment_failed", invoice, created=200))
    assert late.json()["outcome"] == "ignored: already paid"
    assert Invoice.objects.get(pk=invoice.pk).status == "paid"


def test_payment_failed_notifies_then_stops_jobs_after_grace_until_paid(
    invoice, fake_stripe, client, api, lab, settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        resp = post_event(client, event("invoice.payment_failed", invoice, created=200))
    assert resp.json()["outcome"] == "payment failed"
    older = post_event(client, event("invoice.finalized", invoice, created=150))
    assert older.json()["outcome"] == "ignored: the invoice is already payment failed"
    assert Invoice.objects.get(pk=invoice.pk).status == "payment_failed"
    assert Notification.objects.filter(project=lab["a"], kind="payment_failed").exists()
    assert mail.outbox and "Payment failed" in mail.outbox[-1].subject
    account = BillingAccount.objects.get(pk=invoice.account_id)
    assert account.payment_failed_at is not None
    body = {"project": "alpha", "name": "t", "command": "true"}
    assert api(lab["member"]).post("/api/v1/jobs", body, format="json").json()["state"] == "queued"
    BillingAccount.objects.filter(pk=account.pk).update(
        payment_failed_at=timezone.now() - timedelta(days=settings.BILLING_PAYMENT_GRACE_DAYS + 1)
    )
    Invoice.objects.filter(pk=invoice.pk).update(
        payment_failed_at=timezone.now() - timedelta(days=settings.BILLING_PAYMENT_GRACE_DAYS + 1)
    )
    rejected = api(lab["member"]).post("/api/v1/jobs", body, format="json").json()
    assert rejected["state"] == "rejected" and "Payment overdue" in rejected["failure_reason"]
    assert (
        post_event(client, event("invoice.paid", invoice, created=400)).json()["outcome"] == "paid"
    )
    assert BillingAccount.objects.get(pk=account.pk).payment_failed_at is None
    assert api(lab["member"]).post("/api/v1/jobs", body, format="json").json()["state"] == "queued"


def test_unknown_invoices_and_other_events_are_recorded_and_ignored(invoice, fake_stripe, client):
    other = {"id": "evt_c", "type": "customer.created", "created": 1, "data": {"object": {}}}
    assert post_event(client, other).json()["outcome"].startswith("ignored")
    ghost = event("invoice.paid", invoice, created=5)
    ghost["data"]["object"]["metadata"] = {"ledger_invoice_id": "999999"}
    assert post_event(client, ghost).json()["outcome"] == "ignored: unknown invoice"
    assert post_event(client, {"id": "", "type": ""}).status_code == 400
    assert StripeEvent.objects.count() == 2


# ---- paid means paid in full; events ordered by meaning; uncollectible; sweeps -------------


def test_paid_needs_the_whole_amount_in_the_invoice_currency(invoice, fake_stripe, client):
    assert invoice.total > Decimal("1.00")
    cent = post_event(client, event("invoice.paid", invoice, created=300, amount_paid=1))
    assert cent.json()["outcome"] == f"not paid: paid 0.01 of {invoice.total} usd"
    euros = event("invoice.paid", invoice, created=301, currency="eur", event_id="evt_eur")
    assert post_event(client, euros).json()["outcome"].startswith("not paid: paid in eur")
    row = Invoice.objects.get(pk=invoice.pk)
    assert row.status == "open" and row.paid_at is None
    assert AuditEvent.objects.filter(action="billing.invoice.payment_short").count() == 2
    full = post_event(client, event("invoice.paid", invoice, created=302))
    assert full.json()["outcome"] == "paid"


def test_a_late_payment_failed_counts_after_a_newer_finalized(invoice, fake_stripe, client):
    assert post_event(client, event("invoice.finalized", invoice, created=300)).json()[
        "outcome"
    ] == ("finalized")
    late = post_event(client, event("invoice.payment_failed", invoice, created=200))
    assert late.json()["outcome"] == "payment failed"
    assert BillingAccount.objects.get(pk=invoice.account_id).payment_failed_at is not None


@pytest.mark.parametrize(
    "kinds, final",
    [
        (("invoice.finalized", "invoice.payment_failed", "invoice.paid"), "paid"),
        (("invoice.finalized", "invoice.payment_failed"), "payment_failed"),
        (("invoice.payment_failed", "invoice.marked_uncollectible"), "uncollectible"),
        (("invoice.finalized", "invoice.marked_uncollectible", "invoice.paid"), "paid"),
        (("invoice.finalized", "invoice.payment_failed", "invoice.voided"), "void"),
    ],
)
def test_every_order_twice_ends_in_the_same_state(lab, place, fake_stripe, kinds, final):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 05:00"))
    account = services.account_open_for_project(project=lab["a"])
    inv = services.invoice_close(
        account_id=account.pk, period_start=date(2025, 3, 1), now=at("2025-04-01 01:00")
    )
    events = [event(k, inv, created=100 + 10 * i) for i, k in enumerate(kinds)]
    for n, order in enumerate(itertools.permutations(events)):
        with transaction.atomic():
            sid = transaction.savepoint()
            for e in [*order, *order]:  # each delivered twice
                services.stripe_event_apply(event=e)
            row = Invoice.objects.get(pk=inv.pk)
            assert row.status == final, [e["type"] for e in order]
            blocked = BillingAccount.objects.get(pk=account.pk).payment_failed_at is not None
            assert blocked == (final in {"payment_failed", "uncollectible"}), n
            transaction.savepoint_rollback(sid)


def test_marked_uncollectible_is_not_void_the_account_stays_blocked(invoice, fake_stripe, client):
    post_event(client, event("invoice.payment_failed", invoice, created=200))
    out = post_event(client, event("invoice.marked_uncollectible", invoice, created=300))
    assert out.json()["outcome"] == "uncollectible"
    assert Invoice.objects.get(pk=invoice.pk).status == "uncollectible"
    assert BillingAccount.objects.get(pk=invoice.account_id).payment_failed_at is not None
    assert post_event(client, event("invoice.paid", invoice, created=400)).json()["outcome"] == (
        "paid"
    )
    assert BillingAccount.objects.get(pk=invoice.account_id).payment_failed_at is None


def test_a_negative_invoice_is_carried_as_a_credit_not_pushed(lab, place, fake_stripe):
    place(start=at("2025-03-10 00:00"), end=at("2025-03-10 01:00"))
    account = services.account_open_for_project(project=lab["a"])
    Adjustment.objects.create(account=account, amount=Decimal("-50.00"), description="Goodwill")
    march = services.invoice_close(
        account_id=account.pk, period_start=date(2025, 3, 1), now=at("2025-04-01 01:00")
    )
    usage = march.lines.get(kind="usage").amount
    carried = march.lines.get(kind="carried")
    assert carried.amount == Decimal("50.00") - usage
    assert march.total == 0 and march.status == "paid"
    assert services.invoice_push_to_stripe(invoice_id=march.pk) == "nothing to collect"
    assert fake_stripe.calls == []
    carry = Adjustment.objects.get(source_invoice=march)
    assert carry.amount == -carried.amount and carry.invoice is None
    place(start=at("2025-04-10 00:00"), end=at("2025-04-11 00:00"))
    april = services.invoice_close(
        account_id=account.pk, period_start=date(2025, 4, 1), now=at("2025-05-01 01:00")
    )
    assert april.lines.get(kind="adjustment").amount == -carried.amount
    assert april.total == april.lines.get(kind="usage").amount - carried.amount > 0


def test_the_sweep_sends_what_failed_after_the_close_once(invoice, fake_stripe):
    later = invoice.issued_at + timedelta(hours=1)
    # the close's push failed past its retries; its mail never went (SMTP down)
    fake_stripe.fail_next.append("/v1/invoiceitems")
    with pytest.raises(gateway.GatewayError):
        services.invoice_push_to_stripe(invoice_id=invoice.pk)
    assert services.invoices_to_resend(now=invoice.issued_at) == {"email": [], "stripe": []}
    due = services.invoices_to_resend(now=later)
    assert due == {"email": [invoice.pk], "stripe": [invoice.pk]}
    Invoice.objects.filter(pk=invoice.pk).update(issued_at=timezone.now() - timedelta(hours=1))
    app.conf.task_always_eager = True  # the tasks run here, no worker in this test
    try:
        assert tasks.resend_invoices.apply().get() == {"email": 1, "stripe": 1}
        assert tasks.resend_invoices.apply().get() == {"email": 0, "stripe": 0}
    finally:
        app.conf.task_always_eager = False
    assert len(mail.outbox) == 1
    assert sum(1 for c in fake_stripe.calls if c["path"].endswith("/finalize")) == 1
    row = Invoice.objects.get(pk=invoice.pk)
    assert row.stripe_finalized and row.emailed_at is not None
