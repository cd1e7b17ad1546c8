"""Page forms for billing."""

from __future__ import annotations

from decimal import Decimal

from django import forms

from billing import pricing
from billing.pricing import RESERVED_TERMS_MONTHS
from scheduler.models import GpuModel


class BudgetForm(forms.Form):
    monthly_amount = forms.DecimalField(
        max_digits=12, decimal_places=2, min_value=Decimal("0.01"), label="Monthly budget (USD)"
    )
    hard_cap = forms.BooleanField(
        required=False,
        label="Hard cap: refuse jobs that would pass it, stop running ones at 100 % (preemptible ones may use the allowance)",
    )
    preemptible_allowance_percent = forms.IntegerField(
        min_value=0, max_value=100, initial=10, label="Preemptible allowance over the cap (%)"
    )
    alert_thresholds = forms.CharField(
        max_length=40,
        required=False,
        initial="50, 80, 100",
        label="Notify the owners at (% of the budget)",
        help_text="One to five percentages, e.g. 50, 80, 100.",
    )

    def clean_alert_thresholds(self) -> list[int] | None:
        text = self.cleaned_data.get("alert_thresholds") or ""
        if not text.strip():
            return None
        try:
            return pricing.parse_budget_thresholds(text)
        except ValueError as exc:
            raise forms.ValidationError(f"{exc}.") from None


class ReservationRequestForm(forms.Form):
    gpu_model = forms.ModelChoiceField(
        queryset=GpuModel.objects.filter(is_active=True), to_field_name="name", label="GPU model"
    )
    gpus = forms.IntegerField(min_value=1, max_value=4096, label="GPUs")
    term_months = forms.TypedChoiceField(
        choices=[(t, f"{t} months") for t in RESERVED_TERMS_MONTHS], coerce=int, label="Term"
    )
    justification = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2})
    )
