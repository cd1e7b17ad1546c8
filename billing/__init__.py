"""Prices, plans, the usage ledger, budgets, invoices and Stripe."""
