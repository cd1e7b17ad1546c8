"""Optional single sign-on through OpenID Connect (mozilla-django-oidc), on when
`OIDC_RP_CLIENT_ID` is set (config/settings/base.py).

Accounts are matched by e-mail address (our login name), case-insensitively, and only when the
provider says it verified the address. A first sign-in creates an account only when
`OIDC_CREATE_USER` is on (by default: when open sign-up is); otherwise the address must have an
account already (by invitation). Operators still enter a TOTP code after signing in.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from portal.audit import audit_record
from portal.models import User


def verified_email(claims: dict[str, Any]) -> str | None:
    email = str(claims.get("email") or "").strip().lower()
    if not email or claims.get("email_verified") is not True:
        return None
    return email


class EmailOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return verified_email(claims) is not None

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[User]:
        email = verified_email(claims)
        if email is None:
            return User.objects.none()
        return User.objects.filter(email__iexact=email, is_active=True)

    def create_user(self, claims: dict[str, Any]) -> User:
        email = verified_email(claims)
        assert email is not None  # verify_claims came first
        user = User.objects.create_user(email, None, full_name=str(claims.get("name") or "")[:150])
        audit_record(actor=user, action="user.signup", target=user, data={"via": "oidc"})
        return user
