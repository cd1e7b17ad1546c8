from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm

from portal.auth_events import login_locked
from portal.models import Role


class EmailLoginForm(AuthenticationForm):
    username = forms.EmailField(
        label="Email", max_length=254, widget=forms.EmailInput(attrs={"autofocus": True})
    )

    def clean(self) -> dict[str, Any]:
        email = self.cleaned_data.get("username") or ""
        ip = self.request.META.get("REMOTE_ADDR") if self.request is not None else None
        if email and login_locked(email, ip):
            minutes = max(1, settings.LOGIN_LOCKOUT_SECONDS // 60)
            raise forms.ValidationError(
                f"Too many failed attempts. Wait {minutes} minutes, then try again.",
                code="locked",
            )
        cleaned: dict[str, Any] = super().clean()
        return cleaned


class MemberAddForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where you will use it, e.g. 'laptop'.")
