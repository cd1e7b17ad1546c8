"""Billing writes, one module per concern. Each public service is `<entity>_<verb>(*, ...)`
and audited.

- `accounts`: billing accounts per project
- `prices`: price lists, reserved plans
- `credits`: prepaid credit grants
- `metering`: allocations → usage records (and fault credits)
- `coverage`: usage covered by reserved capacity
- `drafts`: the month's draft invoice
- `invoices`: closing a month, step by step
- `budgets`: budgets and their alerts
- `notifications`: in-app notifications and emails (the invoice mail included)
- `stripe_sync`: invoices pushed to Stripe, its webhook events applied, the resend sweep
- `corrections`: late facts as adjustments pointing to the issued invoice they correct
- `periods`: month periods
"""

from billing.services.accounts import (
    account_open_for_project,
    accounts_for_projects,
    project_move_to_account,
)
from billing.services.budgets import (
    budget_caps_enforce,
    budget_remove,
    budget_set,
    budgets_check,
)
from billing.services.coverage import usage_apply_coverage
from billing.services.credits import MAX_MONEY, credit_grant
from billing.services.drafts import draft_invoice, invoice_number
from billing.services.invoices import (
    invoice_close,
    invoice_number_next,
    invoice_pdf,
    invoices_close_month,
)
from billing.services.metering import MeterResult, usage_meter
from billing.services.notifications import (
    invoice_send_email,
    notification_create,
    owner_emails,
    send_plain,
)
from billing.services.periods import period_bounds, period_of, previous_period
from billing.services.prices import (
    PRICE_EPOCH,
    price_list_seed,
    price_publish,
    reserved_plan_create,
    reserved_plan_revise,
    storage_price_publish,
)
from billing.services.stripe_sync import (
    FAILED_EVENTS,
    PAID_EVENTS,
    VOID_EVENTS,
    invoice_push_to_stripe,
    invoices_to_resend,
    stripe_event_apply,
)

__all__ = [
    "FAILED_EVENTS",
    "MAX_MONEY",
    "PAID_EVENTS",
    "PRICE_EPOCH",
    "VOID_EVENTS",
    "MeterResult",
    "account_open_for_project",
    "accounts_for_projects",
    "budget_caps_enforce",
    "budget_remove",
    "budget_set",
    "budgets_check",
    "credit_grant",
    "draft_invoice",
    "invoice_close",
    "invoice_number",
    "invoice_number_next",
    "invoice_pdf",
    "invoice_push_to_stripe",
    "invoice_send_email",
    "invoices_close_month",
    "invoices_to_resend",
    "notification_create",
    "owner_emails",
    "period_bounds",
    "period_of",
    "previous_period",
    "price_list_seed",
    "price_publish",
    "project_move_to_account",
    "reserved_plan_create",
    "reserved_plan_revise",
    "send_plain",
    "storage_price_publish",
    "stripe_event_apply",
    "usage_apply_coverage",
    "usage_meter",
]
