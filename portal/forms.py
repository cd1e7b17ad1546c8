from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm

from portal.auth_events import LOCKED_ATTR, lockout_message
from portal.models import Role, TokenScope, slug_validator


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


class ProjectCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    slug = forms.CharField(
        max_length=50,
        validators=[slug_validator],
        help_text="In URLs and the API: lowercase letters, digits and hyphens.",
    )
    description = forms.CharField(max_length=2000, required=False, widget=forms.Textarea)


class SetPasswordFieldsMixin(forms.Form):
    full_name = forms.CharField(max_length=150, required=False, label="Your name")
    password1 = forms.CharField(label="Password", widget=forms.PasswordInput, strip=False)
    password2 = forms.CharField(label="Password again", widget=forms.PasswordInput, strip=False)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        if cleaned.get("password1") != cleaned.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        return cleaned


class SignupForm(SetPasswordFieldsMixin):
    """The account's details; the address comes from the invitation or verified link."""


class SignupRequestForm(forms.Form):
    email = forms.EmailField(max_length=254)


class EmailChangeForm(forms.Form):
    new_email = forms.EmailField(max_length=254, label="New e-mail address")
    password = forms.CharField(label="Current password", widget=forms.PasswordInput, strip=False)


def errors_in_words(form: forms.Form) -> str:
    """A form's errors on one line ('gpus: Enter a whole number.; term: ...'), for a message."""
    return "; ".join(f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items())
