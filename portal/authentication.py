"""`Authorization: Bearer <token>` for the API, checked against hashed personal tokens."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from portal.models import TokenScope
from portal.services import TokenGrant, token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, TokenGrant] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0] != self.keyword:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Send the header as 'Authorization: Bearer <token>'."
            )
        found = token_authenticate(raw=parts[1])
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return found

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "portal.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer"}


class TokenScopePermission(permissions.BasePermission):
    """A bearer token acts within its scope: `read` tokens only read; `submit` tokens also
    submit, dry-run and cancel jobs (views marked `token_scope = "submit"`); `full` tokens do
    whatever their user may. Sessions are not tokens and are not limited here."""

    message = "This token's scope does not allow this request; create a token with a wider scope."

    def has_permission(self, request: Request, view: Any) -> bool:
        grant = request.auth
        if not isinstance(grant, TokenGrant) or grant.scope == TokenScope.FULL:
            return True
        if request.method in permissions.SAFE_METHODS:
            return True
        if grant.scope == TokenScope.SUBMIT:
            return getattr(view, "token_scope", None) == TokenScope.SUBMIT
        return False
