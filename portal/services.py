"""Writes for tenancy: projects, memberships, roles and tokens. Each one is audited.

A new project's quota row is the scheduler's (`scheduler.quotas`, on `post_save`)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError, NotFound, PermissionDenied
from portal.models import ApiToken, Membership, Project, Role, TokenScope, User, slug_validator
from portal.selectors import project_role_of

TOKEN_PREFIX = "gpc_"
RESERVED_SLUGS = frozenset({"new"})  # /projects/new/ is the creation page


def require_role(*, user: User, project: Project, roles: tuple[str, ...]) -> str:
    """The user's role if it is one of `roles`, else PermissionDenied."""
    role = project_role_of(user=user, project=project)
    if role is None:
        raise NotFound("No such project.")
    if role not in roles:
        raise PermissionDenied(
            f"Your role in {project.name} is {role}; this needs {' or '.join(roles)}."
        )
    return role


@transaction.atomic
def project_create(*, owner: User, slug: str, name: str, description: str = "") -> Project:
    slug, name = slug.strip(), name.strip()
    try:
        slug_validator(slug)
    except ValidationError as exc:
        raise DomainError(" ".join(exc.messages), field="slug") from None
    if slug in RESERVED_SLUGS:
        raise DomainError(f"'{slug}' is a reserved word; choose another slug.", field="slug")
    if not name:
        raise DomainError("Give the project a name.", field="name")
    if Project.objects.filter(slug=slug).exists():
        raise Conflict(f"A project with the slug '{slug}' already exists.", code="slug_taken")
    try:
        with transaction.atomic():
            project = Project.objects.create(slug=slug, name=name, description=description)
    except IntegrityError:  # created by someone else between the check and the insert
        raise Conflict(
            f"A project with the slug '{slug}' already exists.", code="slug_taken"
        ) from None
    Membership.objects.create(project=project, user=owner, role=Role.OWNER)
    audit_record(actor=owner, action="project.create", target=project, project=project)
    return project


def _owner_count(project: Project) -> int:
    return Membership.objects.filter(project=project, role=Role.OWNER).count()


@transaction.atomic
def membership_change_role(
    *, actor: User, project: Project, membership_id: int, role: str
) -> Membership:
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    if role not in Role.values:
        raise DomainError(
            f"Unknown role '{role}'. Use one of: {', '.join(Role.values)}.", field="role"
        )
    membership = (
        Membership.objects.select_for_update().filter(project=project, pk=membership_id).first()
    )
    if membership is None:
        raise NotFound("No such member in this project.")
    old = membership.role
    if old == Role.OWNER and role != Role.OWNER and _owner_count(project) <= 1:
        raise Conflict("A project needs at least one owner; make someone else owner first.")
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        actor=actor,
        action="membership.role_change",
        target=membership,
        project=project,
        data={"user": membership.user.email, "from": old, "to": role},
    )
    return membership


@transaction.atomic
def membership_remove(*, actor: User, project: Project, membership_id: int) -> None:
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    membership = (
        Membership.objects.select_for_update()
        .select_related("user")
        .filter(project=project, pk=membership_id)
        .first()
    )
    if membership is None:
        raise NotFound("No such member in this project.")
    if membership.role == Role.OWNER and _owner_count(project) <= 1:
        raise Conflict("You cannot remove the last owner of a project.")
    audit_record(
        actor=actor,
        action="membership.remove",
        target=membership,
        project=project,
        data={"user": membership.user.email, "role": membership.role},
    )
    membership.delete()


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # shown to the user once, never stored


TOKEN_MAX_DAYS = 366  # a token that expires does so within a year


@transaction.atomic
def token_create(
    *,
    user: User,
    name: str,
    scope: str = TokenScope.FULL,
    expires_in_days: int | None = None,
) -> IssuedToken:
    """A new personal token: `scope` bounds what it may do, `expires_in_days` when it stops
    working (None: never)."""
    name = name.strip()
    if not name:
        raise DomainError("Give the token a name, e.g. 'laptop' or 'ci'.", field="name")
    if scope not in TokenScope.values:
        raise DomainError(
            "The scope is one of: " + ", ".join(TokenScope.values) + ".", field="scope"
        )
    expires_at = None
    if expires_in_days is not None:
        if not 1 <= expires_in_days <= TOKEN_MAX_DAYS:
            raise DomainError(
                f"A token expires in 1 to {TOKEN_MAX_DAYS} days (or never).",
                field="expires_in_days",
            )
        expires_at = timezone.now() + timedelta(days=expires_in_days)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user,
        name=name,
        prefix=secret[: len(TOKEN_PREFIX) + 6],
        token_hash=token_hash(secret),
        scope=scope,
        expires_at=expires_at,
    )
    audit_record(
        actor=user,
        action="token.create",
        target=token,
        data={
            "name": name,
            "scope": scope,
            "expires_at": expires_at.isoformat() if expires_at else None,
        },
    )
    return IssuedToken(token=token, secret=secret)


@transaction.atomic
def token_revoke(*, user: User, token_id: int) -> ApiToken:
    token = ApiToken.objects.select_for_update().filter(user=user, pk=token_id).first()
    if token is None:
        raise NotFound("No such token.")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=user, action="token.revoke", target=token, data={"name": token.name})
    return token


TOKEN_USER = """
SELECT {user_columns}, t.id AS token_id, t.scope AS token_scope,
       (t.last_used_at IS NULL OR t.last_used_at < %s) AS token_last_use_stale
  FROM portal_user u
  JOIN portal_apitoken t ON t.user_id = u.id
 WHERE t.token_hash = %s AND t.revoked_at IS NULL AND u.is_active
   AND (t.expires_at IS NULL OR t.expires_at > %s)
"""
# The user's columns, named, and the statement with them: built on the first request.
_token_user: tuple[str, list[str], bool] | None = None


def _converters(field: Any) -> list[Any]:
    col = field.get_col(User._meta.db_table)
    return [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]


def _token_user_row(*, stale_before: datetime, digest: str, now: datetime) -> Any:
    """The user (from its concrete columns) and the token's id, scope and whether its last
    use is stale, or None. Fast path: a cursor and `from_db`, not `Manager.raw`, whose per-call
    setup (resolving the columns to fields) cost more than the statement (`bench.submit_cost`)."""
    global _token_user
    fields = User._meta.concrete_fields
    if _token_user is None:
        qn = connection.ops.quote_name
        columns = ", ".join(f"u.{qn(str(f.column))}" for f in fields)
        convert = any(_converters(f) for f in fields)
        _token_user = (
            TOKEN_USER.format(user_columns=columns),
            [f.attname for f in fields],
            convert,
        )
    sql, attnames, convert = _token_user
    with connection.cursor() as cursor:
        cursor.execute(sql, [stale_before, digest, now])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row[: len(attnames)])
    if convert:  # none on PostgreSQL; SQLite's datetimes are text
        for i, field in enumerate(fields):
            col = field.get_col(User._meta.db_table)
            for converter in _converters(field):
                values[i] = converter(values[i], col, connection)
    return User.from_db(DEFAULT_DB_ALIAS, attnames, values), row[len(attnames) :]


@dataclass(frozen=True)
class TokenGrant:
    """What an authenticated bearer token grants: its user, within its scope."""

    token_id: int
    scope: str


def token_authenticate(*, raw: str) -> tuple[User, TokenGrant] | None:
    """The active user behind an unexpired, unrevoked bearer token and what the token may do,
    recording when it was last used.

    One plain statement: every API call comes through here.
    """
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    now = timezone.now()
    # Write at most once a minute: a busy client should not turn reads into writes.
    stale_before = now - timedelta(seconds=60)
    found = _token_user_row(stale_before=stale_before, digest=token_hash(raw), now=now)
    if found is None:
        return None
    user, (token_id, scope, last_use_stale) = found
    if last_use_stale:
        ApiToken.objects.filter(pk=token_id).update(last_used_at=now)
    return user, TokenGrant(token_id=token_id, scope=scope)
