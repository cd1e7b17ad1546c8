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
BILLING_CURRENCY = "usd"
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
    "billing-budgets": {
        "task": "billing.check_budgets",
        "schedule": 900.0,
        "options": {"expires": 900},
    },
    "billing-monthly-close": {
        "task": "billing.close_month",
        "schedule": crontab(minute=30, hour=1, day_of_month=1),
    },
}
STRIPE_TIMEOUT_SECONDS = _env.int("STRIPE_TIMEOUT_SECONDS", default=20)
