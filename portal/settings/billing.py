"""Billing settings (owned by the billing app); imported at the end of base settings."""
