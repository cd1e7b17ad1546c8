from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from portal.models import Role


class EmailLoginForm(AuthenticationForm):
    username = forms.EmailField(
        label="Email", max_length=254, widget=forms.EmailInput(attrs={"autofocus": True})
    )


class MemberAddForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where you will use it, e.g. 'laptop'.")
