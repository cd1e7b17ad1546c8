"""Self-service accounts: invitations into projects, sign-up, e-mail change. Each write is audited.

Links sent by e-mail carry a secret: an invitation's is a random single-use token of which
only the SHA-256 is stored (`Invitation.token_hash`); sign-up verification and e-mail change
links are signed (`django.core.signing`, a salt per purpose, `EMAIL_LINK_MAX_AGE_SECONDS`)
and name the address they verify, so owning the mailbox is what they prove.

Nothing here answers differently for an address that has an account and one that has not:
an owner inviting someone learns only that an invitation went out, and open sign-up sends the
existing account's owner a note instead of a second account.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError, NotFound, PermissionDenied
from portal.mail import send_after_commit
from portal.models import Invitation, Membership, Project, Role, User
from portal.services import require_role

SIGNUP_SALT = "portal.signup"
EMAIL_CHANGE_SALT = "portal.email-change"


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def normalize_email(email: str) -> str:
    email = (email or "").strip().lower()
    try:
        validate_email(email)
    except ValidationError:
        raise DomainError("Enter a valid e-mail address.", field="email") from None
    return email


def _password_check(password: str, user: User | None = None) -> None:
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise DomainError(" ".join(exc.messages), field="password") from None


# ---- invitations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedInvitation:
    invitation: Invitation
    token: str  # in the e-mail's link only; never stored


@transaction.atomic
def invitation_create(
    *, actor: User, project: Project, email: str, role: str, base_url: str
) -> IssuedInvitation:
    """Invite `email` into `project` with `role` (owners only) and e-mail the link.

    The answer is the same whether the address has an account or not; a pending invitation of
    the same address is replaced (its link stops working)."""
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    if role not in Role.values:
        raise DomainError(
            f"Unknown role '{role}'. Use one of: {', '.join(Role.values)}.", field="role"
        )
    email = normalize_email(email)
    # Members are listed on the project page the owner sees: saying so reveals nothing new.
    if Membership.objects.filter(project=project, user__email__iexact=email).exists():
        raise Conflict(f"{email} is already a member of {project.name}.")
    now = timezone.now()
    replaced = list(
        Invitation.objects.select_for_update().filter(
            project=project,
            email=email,
            accepted_at__isnull=True,
            revoked_at__isnull=True,
            expires_at__gt=now,
        )
    )
    for old in replaced:
        old.revoked_at = now
        old.save(update_fields=["revoked_at"])
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        project=project,
        email=email,
        role=role,
        token_hash=_hash(token),
        invited_by=actor,
        created_at=now,
        expires_at=now + timedelta(days=settings.INVITATION_TTL_DAYS),
    )
    audit_record(
        actor=actor,
        action="invitation.create",
        target=invitation,
        project=project,
        data={"email": email, "role": role, "replaced": [i.pk for i in replaced]},
    )
    link = base_url.rstrip("/") + reverse("invitation-accept", args=[token])
    send_after_commit(
        subject=f"{actor.display_name} invited you to {project.name} on GPU Cloud",
        body=(
            f"{actor.display_name} ({actor.email}) invited you to the project {project.name} "
            f"as {Role(role).label.lower()}.\n\n"
            f"Accept the invitation here (sign in with this address, or create an account "
            f"with it):\n{link}\n\n"
            f"The link works once and expires on {invitation.expires_at:%Y-%m-%d %H:%M} UTC. "
            "If you did not expect it, ignore this message: nothing happens without you."
        ),
        to=[email],
    )
    return IssuedInvitation(invitation=invitation, token=token)


def invitation_by_token(*, token: str) -> Invitation:
    """The invitation a link names, whatever its state; NotFound for a link that names none."""
    if not token or len(token) > 100:
        raise NotFound("This invitation link is not valid.")
    invitation = (
        Invitation.objects.select_related("project", "invited_by")
        .filter(token_hash=_hash(token))
        .first()
    )
    if invitation is None:
        raise NotFound("This invitation link is not valid.")
    return invitation


def _pending_or_refuse(invitation: Invitation) -> None:
    status = invitation.status
    if status != "pending":
        raise Conflict(f"This invitation is {status}; ask the project's owner for a new one.")


def _accept(invitation: Invitation, user: User) -> Membership:
    now = timezone.now()
    invitation.accepted_at = now
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    try:
        with transaction.atomic():
            membership = Membership.objects.create(
                project=invitation.project, user=user, role=invitation.role
            )
    except IntegrityError:
        raise Conflict(f"You are already a member of {invitation.project.name}.") from None
    audit_record(
        actor=user,
        action="invitation.accept",
        target=invitation,
        project=invitation.project,
        data={"email": invitation.email, "role": invitation.role},
    )
    audit_record(
        actor=user,
        action="membership.add",
        target=membership,
        project=invitation.project,
        data={"user": user.email, "role": invitation.role, "invitation": invitation.pk},
    )
    return membership


@transaction.atomic
def invitation_accept(*, user: User, token: str) -> Membership:
    """Join the project as the invitation says: only the account with the invited address."""
    invitation = invitation_by_token(token=token)
    invitation = (
        Invitation.objects.select_for_update().select_related("project").get(pk=invitation.pk)
    )
    _pending_or_refuse(invitation)
    if user.email.lower() != invitation.email:
        raise PermissionDenied(
            "This invitation was sent to another e-mail address. Sign in with that address "
            "to accept it."
        )
    return _accept(invitation, user)


@transaction.atomic
def invitation_signup(*, token: str, full_name: str, password: str) -> User:
    """Create the invited address's account (the link proves the mailbox) and accept."""
    invitation = invitation_by_token(token=token)
    invitation = (
        Invitation.objects.select_for_update().select_related("project").get(pk=invitation.pk)
    )
    _pending_or_refuse(invitation)
    if User.objects.filter(email__iexact=invitation.email).exists():
        raise Conflict("An account with this address exists: sign in to accept the invitation.")
    _password_check(password, User(email=invitation.email, full_name=full_name))
    user = User.objects.create_user(invitation.email, password, full_name=full_name.strip())
    audit_record(actor=user, action="user.signup", target=user, data={"via": "invitation"})
    _accept(invitation, user)
    return user


@transaction.atomic
def invitation_revoke(*, actor: User, project: Project, invitation_id: int) -> Invitation:
    require_role(user=actor, project=project, roles=(Role.OWNER,))
    invitation = (
        Invitation.objects.select_for_update().filter(project=project, pk=invitation_id).first()
    )
    if invitation is None:
        raise NotFound("No such invitation in this project.")
    if not invitation.is_pending:
        raise Conflict(f"This invitation is already {invitation.status}.")
    invitation.revoked_at = timezone.now()
    invitation.save(update_fields=["revoked_at"])
    audit_record(
        actor=actor,
        action="invitation.revoke",
        target=invitation,
        project=project,
        data={"email": invitation.email},
    )
    return invitation


# ---- open sign-up --------------------------------------------------------------------------


def signup_request(*, email: str, base_url: str) -> None:
    """Open sign-up, step 1: e-mail a verification link (or, for an address that has an
    account, a note saying so). The caller answers the same either way."""
    if not settings.SIGNUP_OPEN:
        raise NotFound("Sign-up is by invitation.")
    email = normalize_email(email)
    if User.objects.filter(email__iexact=email).exists():
        login = base_url.rstrip("/") + reverse("login")
        reset = base_url.rstrip("/") + reverse("password_reset")
        send_after_commit(
            subject="Your GPU Cloud account",
            body=(
                "Someone (probably you) asked to create a GPU Cloud account with this address, "
                f"which already has one. Sign in at {login}; if you forgot the password, "
                f"reset it at {reset}."
            ),
            to=[email],
        )
        return
    token = signing.dumps({"email": email}, salt=SIGNUP_SALT)
    link = base_url.rstrip("/") + reverse("signup-verify", args=[token])
    send_after_commit(
        subject="Confirm your e-mail address for GPU Cloud",
        body=(
            f"Finish creating your GPU Cloud account here:\n{link}\n\n"
            "If you did not ask for an account, ignore this message."
        ),
        to=[email],
    )


def _unsign(token: str, salt: str) -> dict[str, Any]:
    try:
        value = signing.loads(token, salt=salt, max_age=settings.EMAIL_LINK_MAX_AGE_SECONDS)
    except signing.SignatureExpired:
        raise DomainError("This link has expired; ask for a new one.", code="expired") from None
    except signing.BadSignature:
        raise NotFound("This link is not valid.") from None
    if not isinstance(value, dict):
        raise NotFound("This link is not valid.")
    return value


def signup_email_of(*, token: str) -> str:
    if not settings.SIGNUP_OPEN:
        raise NotFound("Sign-up is by invitation.")
    return str(_unsign(token, SIGNUP_SALT)["email"])


@transaction.atomic
def signup_complete(*, token: str, full_name: str, password: str) -> User:
    email = signup_email_of(token=token)
    if User.objects.filter(email__iexact=email).exists():
        raise Conflict("An account with this address exists: sign in instead.")
    _password_check(password, User(email=email, full_name=full_name))
    user = User.objects.create_user(email, password, full_name=full_name.strip())
    audit_record(actor=user, action="user.signup", target=user, data={"via": "open"})
    return user


# ---- e-mail change -------------------------------------------------------------------------


def email_change_request(*, user: User, new_email: str, password: str, base_url: str) -> None:
    """Send a confirmation link to the new address; nothing changes until it is followed."""
    if not user.check_password(password):
        raise DomainError("Your current password is not right.", field="password")
    new_email = normalize_email(new_email)
    if new_email == user.email.lower():
        raise DomainError("That is already your address.", field="new_email")
    audit_record(
        actor=user, action="user.email_change_request", target=user, data={"to": new_email}
    )
    token = signing.dumps(
        {"uid": user.pk, "old": user.email, "new": new_email}, salt=EMAIL_CHANGE_SALT
    )
    link = base_url.rstrip("/") + reverse("email-change-confirm", args=[token])
    # Sent even when the address has an account: confirming then fails, for the mailbox's owner.
    send_after_commit(
        subject="Confirm your new e-mail address for GPU Cloud",
        body=(
            f"Follow this link, signed in as {user.email}, to make this your GPU Cloud "
            f"address:\n{link}\n\nIf you did not ask for this, ignore this message."
        ),
        to=[new_email],
    )


@transaction.atomic
def email_change_confirm(*, user: User, token: str) -> User:
    value = _unsign(token, EMAIL_CHANGE_SALT)
    if value.get("uid") != user.pk:
        raise PermissionDenied("This link belongs to another account. Sign in with it first.")
    user = User.objects.select_for_update().get(pk=user.pk)
    if user.email != value.get("old"):
        raise Conflict("Your address changed since this link was sent; ask for a new one.")
    new = str(value["new"])
    if User.objects.filter(email__iexact=new).exclude(pk=user.pk).exists():
        raise Conflict("Another account uses this address.")
    old = user.email
    user.email = new
    user.save(update_fields=["email"])
    audit_record(actor=user, action="user.email_change", target=user, data={"from": old, "to": new})
    send_after_commit(
        subject="Your GPU Cloud e-mail address was changed",
        body=(
            f"The GPU Cloud account that used {old} now uses {new}. If you did not do this, "
            "contact your operators at once."
        ),
        to=[old],
    )
    return user
