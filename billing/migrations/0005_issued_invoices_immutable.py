"""Issued invoices are immutable: PostgreSQL refuses a change to the money of an issued
invoice, its lines or its usage records (status, payment and Stripe fields may move)."""

from django.db import migrations

ISSUED = "NOT IN ('draft', 'nothing')"


def _guard(table: str, columns: list[str], what: str) -> str:
    new = ", ".join(f"NEW.{c}" for c in columns)
    old = ", ".join(f"OLD.{c}" for c in columns)
    return f"""
CREATE OR REPLACE FUNCTION {table}_issued_guard() RETURNS trigger AS $$
BEGIN
    IF OLD.invoice_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM billing_invoice i WHERE i.id = OLD.invoice_id AND i.status {ISSUED}
    ) THEN
        IF TG_OP = 'DELETE' OR ({new}) IS DISTINCT FROM ({old}) THEN
            RAISE EXCEPTION '{what} % is on issued invoice % and cannot change',
                OLD.id, OLD.invoice_id USING ERRCODE = 'integrity_constraint_violation';
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER {table}_immutable BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {table}_issued_guard();
"""


INVOICE_MONEY = [
    "number",
    "account_id",
    "period_start",
    "subtotal",
    "credits_applied",
    "tax_rate",
    "tax",
    "total",
    "currency",
    "seller",
    "buyer",
]

FORWARD = (
    f"""
CREATE OR REPLACE FUNCTION billing_invoice_issued_guard() RETURNS trigger AS $$
BEGIN
    IF OLD.status {ISSUED} AND (
        TG_OP = 'DELETE'
        OR ({", ".join(f"NEW.{c}" for c in INVOICE_MONEY)})
            IS DISTINCT FROM ({", ".join(f"OLD.{c}" for c in INVOICE_MONEY)})
    ) THEN
        RAISE EXCEPTION 'invoice % is issued and cannot change', OLD.number
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER billing_invoice_immutable BEFORE UPDATE OR DELETE ON billing_invoice
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_issued_guard();
"""
    + _guard(
        "billing_invoiceline",
        [
            "invoice_id",
            "position",
            "kind",
            "description",
            "amount",
            "gpu_hours",
            "unit_price",
            "record_count",
        ],
        "line",
    )
    + _guard(
        "billing_usagerecord",
        [
            "invoice_id",
            "amount",
            "gross_amount",
            "fault_credit",
            "covered_milli_seconds",
            "milli_seconds",
            "rate",
        ],
        "usage record",
    )
)

BACKWARD = """
DROP TRIGGER IF EXISTS billing_usagerecord_immutable ON billing_usagerecord;
DROP TRIGGER IF EXISTS billing_invoiceline_immutable ON billing_invoiceline;
DROP TRIGGER IF EXISTS billing_invoice_immutable ON billing_invoice;
DROP FUNCTION IF EXISTS billing_usagerecord_issued_guard();
DROP FUNCTION IF EXISTS billing_invoiceline_issued_guard();
DROP FUNCTION IF EXISTS billing_invoice_issued_guard();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD, params=None)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD, params=None)


class Migration(migrations.Migration):
    dependencies = [("billing", "0004_invoice_numbers_corrections")]

    operations = [migrations.RunPython(forward, backward)]
