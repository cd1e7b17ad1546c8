"""Billing settings (owned by the billing app); imported at the end of base settings.

`BILLING_BEAT_SCHEDULE` is merged into CELERY_BEAT_SCHEDULE by base settings.
"""

import environ
from celery.schedules import crontab

_env = environ.Env()

# Stripe: switched off (billing works locally) when no key is configured.
STRIPE_SECRET_KEY = _env("STRIPE_SECRET_KEY", default="")
STRIPE_WEBHOOK_SECRET = _env("STRIPE_WEBHOOK_SECRET", default="")
STRIPE_API_BASE = _env("STRIPE_API_BASE", default="")  # tests point this at a local fake
STRIPE_WEBHOOK_TOLERANCE_SECONDS = _env.int("STRIPE_WEBHOOK_TOLERANCE_SECONDS", default=300)

BILLING_PROVIDER_NAME = _env("BILLING_PROVIDER_NAME", default="GPU Cloud")
# One currency for the installation (docs/billing.md, "Currency"): prices, invoices, Stripe.
BILLING_CURRENCY = _env("BILLING_CURRENCY", default="usd").lower()
# Hard budget caps: how often running work is checked against them (the overshoot bound is
# one such interval of the project's burn plus its jobs' preemption grace), and the hours a
# job without a time limit is assumed to run when admission counts its expected cost.
BILLING_CAP_CHECK_SECONDS = _env.float("BILLING_CAP_CHECK_SECONDS", default=60.0)
BILLING_CAP_ASSUMED_HOURS = _env.float("BILLING_CAP_ASSUMED_HOURS", default=1.0)
# The issuer: its invoice numbers are one sequence (BILLING_ISSUER_ID-000001, …) and its
# legal details are printed on every invoice.
BILLING_ISSUER_ID = _env("BILLING_ISSUER_ID", default="GPC")
BILLING_SELLER_NAME = _env("BILLING_SELLER_NAME", default=BILLING_PROVIDER_NAME)
BILLING_SELLER_ADDRESS = _env("BILLING_SELLER_ADDRESS", default="")
BILLING_SELLER_TAX_ID = _env("BILLING_SELLER_TAX_ID", default="")
BILLING_SELLER_EMAIL = _env("BILLING_SELLER_EMAIL", default="")
# Invoices whose e-mail or Stripe push has not gone out are retried by a sweep for this long.
BILLING_RESEND_DAYS = _env.int("BILLING_RESEND_DAYS", default=30)
BILLING_PAYMENT_GRACE_DAYS = _env.int("BILLING_PAYMENT_GRACE_DAYS", default=7)
BILLING_INVOICE_DUE_DAYS = _env.int("BILLING_INVOICE_DUE_DAYS", default=14)
BILLING_METER_SECONDS = _env.float("BILLING_METER_SECONDS", default=300.0)

BILLING_BEAT_SCHEDULE = {
    "billing-slurm-meter": {  # sacct of Slurm-backed pools → the ledger (billing/slurm.py)
        "task": "billing.slurm_meter",
        "schedule": 600.0,
        "options": {"expires": 600},
    },
    "billing-meter": {
        "task": "billing.meter",
        "schedule": BILLING_METER_SECONDS,
        "options": {"expires": BILLING_METER_SECONDS},
    },
    "billing-caps": {
        "task": "billing.enforce_caps",
        "schedule": BILLING_CAP_CHECK_SECONDS,
        "options": {"expires": BILLING_CAP_CHECK_SECONDS},
    },
    "billing-budgets": {
        "task": "billing.check_budgets",
        "schedule": 900.0,
        "options": {"expires": 900},
    },
    "billing-resend-invoices": {  # an invoice whose mail or Stripe push failed goes out
        "task": "billing.resend_invoices",
        "schedule": 900.0,
        "options": {"expires": 900},
    },
    "billing-monthly-close": {
        "task": "billing.close_month",
        "schedule": crontab(minute=30, hour=1, day_of_month=1),
    },
}
STRIPE_TIMEOUT_SECONDS = _env.int("STRIPE_TIMEOUT_SECONDS", default=20)
