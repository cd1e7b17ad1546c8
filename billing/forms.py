"""Page forms for billing."""

from __future__ import annotations

from decimal import Decimal

from django import forms


class BudgetForm(forms.Form):
    monthly_amount = forms.DecimalField(
        max_digits=12, decimal_places=2, min_value=Decimal("0.01"), label="Monthly budget (USD)"
    )
    hard_cap = forms.BooleanField(
        required=False, label="Hard cap: refuse new jobs at 100 % (preemptible ones still run)"
    )
    preemptible_allowance_percent = forms.IntegerField(
        min_value=0, max_value=100, initial=10, label="Preemptible allowance over the cap (%)"
    )
