"""Tenancy: users (email login), projects, memberships and roles, API tokens, audit."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, BaseUserManager, PermissionsMixin
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone


class UserManager(BaseUserManager["User"]):
    use_in_migrations = True

    def create_user(self, email: str, password: str | None = None, **extra: Any) -> User:
        if not email:
            raise ValueError("An email address is required.")
        user = self.model(email=self.normalize_email(email).lower(), **extra)
        user.set_password(password)
        user.save(using=self._db)
        return user

    def create_superuser(self, email: str, password: str | None = None, **extra: Any) -> User:
        extra.setdefault("is_staff", True)
        extra.setdefault("is_superuser", True)
        return self.create_user(email, password, **extra)


class User(AbstractBaseUser, PermissionsMixin):
    """A person. Logs in with email and password; `is_staff` marks an operator."""

    email = models.EmailField(unique=True, max_length=254)
    full_name = models.CharField(max_length=150, blank=True)
    is_active = models.BooleanField(default=True)
    is_staff = models.BooleanField(default=False, help_text="Operators: may use the admin.")
    date_joined = models.DateTimeField(default=timezone.now)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: ClassVar[list[str]] = []

    class Meta:
        ordering = ["email"]

    def __str__(self) -> str:
        return self.email

    @property
    def display_name(self) -> str:
        return self.full_name or self.email


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"


slug_validator = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$",
    "Use 1-50 lowercase letters, digits and hyphens, not starting or ending with a hyphen.",
)


class Project(models.Model):
    """The tenant: jobs, quotas, budgets and invoices (of the apps above) belong to a project."""

    slug = models.SlugField(max_length=50, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True, max_length=2000)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "user__email"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "user"],
                name="membership_unique_user_per_project",
                violation_error_message="This person is already a member of the project.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class TokenScope(models.TextChoices):
    """What a personal token may do; a token never does more than its user may."""

    READ = "read", "Read only"
    SUBMIT = "submit", "Read, submit and cancel jobs"
    FULL = "full", "Everything the user may do"


class ApiToken(models.Model):
    """A personal API token. Only its SHA-256 is stored; the secret is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, db_index=True, help_text="Shown to tell tokens apart.")
    token_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.FULL)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Refused from then on; empty for a token that never expires.",
    )
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and (
            self.expires_at is None or self.expires_at > timezone.now()
        )


class AuditEvent(models.Model):
    """Who changed what, when, from where. Written by services; never edited."""

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor_label = models.CharField(max_length=254, blank=True, help_text="Who, kept if deleted.")
    action = models.CharField(max_length=64, db_index=True)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    data = models.JSONField(default=dict, blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target_idx")]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor_label} {self.action}"


class IdempotencyKey(models.Model):
    """The first answer to a POST that carried an `Idempotency-Key` header (portal/api/idempotency).

    Stored in the same transaction as what the request wrote, so an answer is never kept without
    its effect nor an effect without its answer; the unique key is also the lock that makes a
    concurrent retry wait for the first request and then get its answer. The key is stored only
    as a hash and the answer sealed with the key itself: an answer may hold a token's secret.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key_hash = models.CharField(max_length=64, help_text="SHA-256 of the user and the key.")
    method = models.CharField(max_length=10)
    path = models.TextField()
    request_hash = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_sealed = models.TextField(blank=True, help_text="The JSON body, sealed; empty: none.")
    location = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "key_hash"],
                name="idempotency_key_unique_per_user",
                violation_error_message="This Idempotency-Key is already in use.",
            )
        ]
        indexes = [models.Index(fields=["user", "created_at"], name="idempotency_key_user_age")]

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


class Invitation(models.Model):
    """An owner's invitation of an e-mail address into a project with a role.

    Only the SHA-256 of its single-use token is stored; the link in the e-mail carries the
    token. It is accepted only by an account with the invited address (signed in, or signing
    up through it), before `expires_at`, once."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=254)
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["project", "email"], name="invitation_project_email")]

    def __str__(self) -> str:
        return f"{self.email} to {self.project} ({self.role})"

    @property
    def status(self) -> str:
        if self.accepted_at is not None:
            return "accepted"
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return "pending"

    @property
    def is_pending(self) -> bool:
        return self.status == "pending"


class NoticeKind(models.TextChoices):
    """What a user or a project's webhook may be told of (portal/notify.py)."""

    JOB_STARTED = "job.started", "A job started"
    JOB_SUCCEEDED = "job.succeeded", "A job ended successfully"
    JOB_FAILED = "job.failed", "A job failed"
    JOB_PREEMPTED = "job.preempted", "A job was preempted"
    JOB_REQUEUED = "job.requeued", "A job was requeued"
    REQUEST_DECIDED = "request.decided", "A quota or reservation request was decided"
    BUDGET_THRESHOLD = "budget.threshold", "A budget threshold was crossed"


class NotificationPreference(models.Model):
    """A user's choice for one kind of notice; no row means e-mail is on."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notice_preferences"
    )
    kind = models.CharField(max_length=32, choices=NoticeKind.choices)
    email = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "kind"], name="notice_pref_unique_kind")
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.kind}: {'e-mail' if self.email else 'off'}"


class ProjectWebhook(models.Model):
    """A project's webhook: every notice of the project is POSTed to `url`, signed with
    HMAC-SHA256 of `secret` (the receiver needs the secret itself, so it is kept, not hashed)."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="webhook")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=64)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Webhook of {self.project}: {self.url}"


class WebhookDelivery(models.Model):
    """One notice to one webhook, with its attempts (retried by Celery with backoff)."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"

    webhook = models.ForeignKey(ProjectWebhook, on_delete=models.CASCADE, related_name="deliveries")
    kind = models.CharField(max_length=32, choices=NoticeKind.choices)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.kind} → {self.webhook.url} ({self.status})"
