from __future__ import annotations

from django import forms

from storage.models import MAX_VOLUME_GIB, VolumeKind


class VolumeForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits and hyphens.")
    kind = forms.ChoiceField(choices=VolumeKind.choices, initial=VolumeKind.SHARED)
    size_gib = forms.IntegerField(
        min_value=1, max_value=MAX_VOLUME_GIB, label="Size limit (GiB)", initial=10
    )
    is_dataset = forms.BooleanField(
        required=False, label="Dataset (read-only, filled by an upload or an import)"
    )
    node_name = forms.CharField(
        max_length=253, required=False, label="Node (node-local only; blank: the first job's)"
    )
    source_url = forms.CharField(
        max_length=2000, required=False, label="Import from URL (datasets; http or https)"
    )


class StorageRequestForm(forms.Form):
    max_gib = forms.IntegerField(min_value=1, label="Storage quota wanted (GiB)")
    justification = forms.CharField(max_length=2000, widget=forms.Textarea(attrs={"rows": 2}))


class StorageQuotaForm(forms.Form):
    max_gib = forms.IntegerField(min_value=0, label="Storage quota (GiB)")


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("decline", "Decline")])
    reason = forms.CharField(max_length=2000, required=False)
