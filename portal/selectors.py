"""Reads scoped to what a user may see. Every view and endpoint goes through these."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from foundation.db import CompiledQuery, concrete_columns, instance_from_row
from portal.errors import NotFound
from portal.models import ApiToken, AuditEvent, Invitation, Membership, Project, Role, User


def project_list_visible_to(*, user: User) -> QuerySet[Project]:
    """Projects the user is a member of; operators (staff) see every project."""
    qs = Project.objects.all()
    if not user.is_staff:
        qs = qs.filter(memberships__user=user)
    return qs.order_by("name").distinct()


# Fast path (`bench.submit_cost`, `bench.submit_throughput`): every API submission (and most
# project pages) asks, and building the annotated queryset cost more than PostgreSQL answering.
_VISIBLE_BY_SLUG = CompiledQuery(
    lambda slug, user_id: (
        Project.objects.filter(slug=slug)
        .order_by()
        .values_list(
            *concrete_columns(Project),
            Subquery(
                Membership.objects.filter(project=OuterRef("pk"), user_id=user_id)
                .order_by()
                .values("role")
            ),
        )
    )
)


def project_get_visible(*, user: User, slug: str) -> Project:
    """One visible project, or NotFound: another tenant's project looks like no project.

    The user's role in it is read by the same statement and kept on the instance, so the
    `project_role_of` (or `require_role`) that usually follows costs no second query.
    """
    rows = _VISIBLE_BY_SLUG.rows(slug=slug, user_id=user.pk)  # the slug is unique
    role_name = rows[0][-1] if rows else None
    if not rows or (role_name is None and not user.is_staff):
        raise NotFound("No such project.")
    project = instance_from_row(Project, rows[0][:-1])
    project._role_read_for = (user.pk, role_name)  # type: ignore[attr-defined]
    return project


def project_role_of(*, user: User, project: Project) -> str | None:
    """The user's role in the project, or None. Staff who are not members act as viewers."""
    read = getattr(project, "_role_read_for", None)
    if read is not None and read[0] == user.pk:
        role = read[1]
    else:
        role = (
            Membership.objects.filter(project=project, user=user)
            .values_list("role", flat=True)
            .first()
        )
    if role is None and user.is_staff:
        return Role.VIEWER
    return role


def membership_list(*, project: Project) -> QuerySet[Membership]:
    return Membership.objects.filter(project=project).select_related("user").order_by("user__email")


def token_list_of(*, user: User) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("-created_at")


def invitation_list_pending(*, project: Project) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        project=project,
        accepted_at__isnull=True,
        revoked_at__isnull=True,
        expires_at__gt=timezone.now(),
    ).order_by("-created_at")


def audit_events_of(*, project: Project) -> QuerySet[AuditEvent]:
    """One project's audit events, newest first: only events recorded against it."""
    return (
        AuditEvent.objects.filter(project=project)
        .select_related("actor")
        .order_by("-created_at", "-pk")
    )


def project_owner_emails(*, project: Project) -> list[str]:
    return sorted(
        Membership.objects.filter(project=project, role=Role.OWNER).values_list(
            "user__email", flat=True
        )
    )


def operator_emails() -> list[str]:
    """Active operators (staff): who is told of requests waiting for a decision."""
    return sorted(
        User.objects.filter(is_staff=True, is_active=True).values_list("email", flat=True)
    )
