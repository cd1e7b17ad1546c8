from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from portal.auth_events import LOCKED_ATTR, lockout_message
from portal.models import Role, TokenScope


class LockoutMessageMixin:
    """Says 'locked, wait' instead of 'wrong password' when the authentication backend
    refused the attempt because the account is locked (it is refused, and audited, either way)."""

    request: Any

    def clean(self) -> dict[str, Any]:
        try:
            cleaned: dict[str, Any] = super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            if self.request is not None and getattr(self.request, LOCKED_ATTR, False):
                raise forms.ValidationError(lockout_message(), code="locked") from None
            raise
        return cleaned


class EmailLoginForm(LockoutMessageMixin, AuthenticationForm):
    username = forms.EmailField(
        label="Email", max_length=254, widget=forms.EmailInput(attrs={"autofocus": True})
    )


class AdminLoginForm(LockoutMessageMixin, AdminAuthenticationForm):
    """The admin's login, under the same lockout as the login page."""


class MemberAddForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where you will use it, e.g. 'laptop'.")
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.FULL, required=False)
    expires_in_days = forms.TypedChoiceField(
        choices=[("30", "30 days"), ("90", "90 days"), ("365", "1 year"), ("", "Never")],
        coerce=int,
        empty_value=None,
        required=False,
        initial="90",
        label="Expires in",
    )
