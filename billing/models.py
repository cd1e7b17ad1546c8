"""Billing: price list, accounts and plans, the usage ledger, budgets, invoices, Stripe events.

The ledger (UsageRecord) is the source of truth. Every money field is a Decimal; usage is
integer seconds × milli-GPU. Idempotency comes from unique constraints, not from care.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from billing import pricing

ZERO = Decimal("0")
ONE = Decimal("1")


def _fraction_field(default: str, help_text: str) -> models.DecimalField:  # type: ignore[type-arg]
    return models.DecimalField(
        max_digits=5,
        decimal_places=4,
        default=Decimal(default),
        validators=[MinValueValidator(ZERO), MaxValueValidator(ONE)],
        help_text=help_text,
    )


class PriceVersion(models.Model):
    """Prices of one GPU model from `effective_from` until the next version. Versions are
    added, never edited once in effect: a change never rewrites the past."""

    gpu_model = models.ForeignKey(
        "scheduler.GpuModel", on_delete=models.PROTECT, related_name="price_versions"
    )
    effective_from = models.DateTimeField(db_index=True)
    on_demand_per_gpu_hour = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        validators=[MinValueValidator(ZERO)],
        help_text="Pay-as-you-go USD per GPU-hour.",
    )
    preemptible_discount = _fraction_field("0.6000", "Fraction off for preemptible work.")
    reserved_discount_1m = _fraction_field("0.1000", "Fraction off for a 1-month reservation.")
    reserved_discount_12m = _fraction_field("0.3000", "Fraction off for a 12-month reservation.")
    reserved_discount_36m = _fraction_field("0.5000", "Fraction off for a 36-month reservation.")
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["gpu_model__name", "effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu_model", "effective_from"],
                name="price_unique_model_effective_from",
                violation_error_message="This GPU model already has a price from that moment.",
            ),
            models.CheckConstraint(
                condition=models.Q(on_demand_per_gpu_hour__gte=0),
                name="price_not_negative",
                violation_error_message="A price cannot be negative.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_model_id} from {self.effective_from:%Y-%m-%d %H:%M}"

    def reserved_discount(self, term_months: int) -> Decimal:
        if term_months not in pricing.RESERVED_TERMS_MONTHS:
            raise KeyError(term_months)
        discount: Decimal = getattr(self, f"reserved_discount_{term_months}m")
        return discount

    @staticmethod
    def default_preemptible_discount() -> Decimal:
        """The discount of a model without a price version yet (PREEMPTIBLE_DISCOUNT)."""
        return Decimal(str(settings.PREEMPTIBLE_DISCOUNT)).quantize(pricing.RATE_QUANT)

    def rate(self, *, preemptible: bool) -> Decimal:
        return pricing.effective_rate(
            on_demand=self.on_demand_per_gpu_hour,
            preemptible=preemptible,
            preemptible_discount=self.preemptible_discount,
        )


class BillingAccount(models.Model):
    """Who pays: one per project by default, or one shared by several projects."""

    name = models.CharField(max_length=100)
    email = models.EmailField(blank=True, help_text="Extra invoice recipient besides owners.")
    currency = models.CharField(max_length=3, default="usd")
    tax_rate = _fraction_field("0", "Tax as a fraction (0.19 = 19 %); 0 for none.")
    legal_name = models.CharField(
        max_length=200, blank=True, help_text="The buyer's legal name on invoices (default: name)."
    )
    legal_address = models.TextField(max_length=500, blank=True)
    tax_id = models.CharField(max_length=50, blank=True, help_text="The buyer's VAT or tax id.")
    stripe_customer_id = models.CharField(max_length=64, blank=True)
    payment_failed_at = models.DateTimeField(
        null=True, blank=True, help_text="Oldest unpaid failed payment; new jobs stop after grace."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """One currency for the installation (docs/billing.md, "Currency"): the price list is
        in it, so an account in another would get invoices labelled in one currency carrying
        amounts of another."""
        super().clean()
        if self.currency.lower() != settings.BILLING_CURRENCY:
            raise ValidationError(
                {
                    "currency": f"This installation bills in {settings.BILLING_CURRENCY.upper()} "
                    "only (BILLING_CURRENCY); its prices are in that currency."
                }
            )


class ProjectBilling(models.Model):
    """Which account a project's usage is billed to."""

    project = models.OneToOneField(
        "portal.Project", on_delete=models.CASCADE, related_name="billing"
    )
    account = models.ForeignKey(
        BillingAccount, on_delete=models.PROTECT, related_name="project_links"
    )

    class Meta:
        ordering = ["project__slug"]

    def __str__(self) -> str:
        return f"{self.project} → {self.account}"


class ReservedPlan(models.Model):
    """N GPUs of a model for a term at a monthly fee; the scheduler guarantees them and usage
    of that model up to N GPUs is covered, the rest is pay-as-you-go."""

    class Term(models.IntegerChoices):
        ONE_MONTH = 1, "1 month"
        ONE_YEAR = 12, "12 months"
        THREE_YEARS = 36, "36 months"

    account = models.ForeignKey(
        BillingAccount, on_delete=models.PROTECT, related_name="reserved_plans"
    )
    project = models.ForeignKey(
        "portal.Project",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Whose jobs the scheduler guarantees the GPUs to (default: the account's only project).",
    )
    gpu_model = models.ForeignKey("scheduler.GpuModel", on_delete=models.PROTECT, related_name="+")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    term_months = models.PositiveSmallIntegerField(choices=Term.choices)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    monthly_fee = models.DecimalField(max_digits=12, decimal_places=2)
    price_version = models.ForeignKey(PriceVersion, on_delete=models.PROTECT, related_name="+")
    supersedes = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="superseded_by",
        help_text="The plan version this one replaced (a change of GPUs or start).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    # what the fee was frozen against: a change is a new plan version (`reserved_plan_revise`)
    FROZEN_FIELDS = (
        "account_id",
        "gpu_model_id",
        "gpus",
        "term_months",
        "starts_at",
        "ends_at",
        "monthly_fee",
        "price_version_id",
    )

    class Meta:
        ordering = ["-starts_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(ends_at__gt=models.F("starts_at")),
                name="reserved_ends_after_start",
                violation_error_message="A reservation must end after it starts.",
            ),
            models.CheckConstraint(
                condition=models.Q(gpus__gte=1),
                name="reserved_at_least_one_gpu",
                violation_error_message="A reservation holds at least one GPU.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpus} × {self.gpu_model_id} for {self.term_months} months ({self.account})"

    def clean(self) -> None:
        """A plan's GPUs, start, term and fee are frozen once it exists: a change is a new
        plan version (the service `reserved_plan_revise`), never an edit under the fee."""
        super().clean()
        if self.pk is None:
            return
        old = ReservedPlan.objects.filter(pk=self.pk).values(*self.FROZEN_FIELDS).first()
        if old is None:
            return
        changed = [f for f in self.FROZEN_FIELDS if getattr(self, f) != old[f]]
        if changed:
            raise ValidationError(
                "A reserved plan's GPUs, start, term and fee cannot change under its frozen "
                f"fee ({', '.join(f.removesuffix('_id') for f in changed)}): revise it into "
                "a new plan version instead."
            )


class CreditGrant(models.Model):
    """Prepaid credits, drawn down before anything is charged."""

    account = models.ForeignKey(BillingAccount, on_delete=models.PROTECT, related_name="credits")
    amount = models.DecimalField(
        max_digits=12, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )
    description = models.CharField(max_length=200, blank=True)
    granted_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["granted_at", "pk"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(amount__gt=0),
                name="credit_positive",
                violation_error_message="A credit grant is a positive amount.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.amount} for {self.account}"


class Adjustment(models.Model):
    """A manual charge (positive) or credit (negative) for the account's next invoice."""

    account = models.ForeignKey(
        BillingAccount, on_delete=models.PROTECT, related_name="adjustments"
    )
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    description = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    invoice = models.ForeignKey(
        "Invoice", null=True, blank=True, on_delete=models.PROTECT, related_name="adjustments"
    )
    source_invoice = models.ForeignKey(
        "Invoice",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="corrections",
        help_text="The issued invoice this corrects or carries a credit balance from.",
    )
    source_allocation = models.ForeignKey(
        "scheduler.Allocation",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The allocation whose invoiced usage this corrects (a late fault credit).",
    )

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["source_allocation", "source_invoice"],
                condition=models.Q(source_allocation__isnull=False),
                name="adjustment_one_correction_per_invoice",
                violation_error_message="This allocation's usage on that invoice is already corrected.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.amount} {self.description}"


class Tier(models.TextChoices):
    ON_DEMAND = pricing.TIER_ON_DEMAND, "Pay-as-you-go"
    PREEMPTIBLE = pricing.TIER_PREEMPTIBLE, "Preemptible"


class UsageRecord(models.Model):
    """One priced slice of an allocation. Unique per allocation and slice start: metering twice
    never double-counts. Slices end at the allocation end, hour (so month) boundaries and price
    changes."""

    # Foreign keys that lead an index of Meta (or the unique constraint) get no index of their
    # own: every index is written for every usage record (`bench.slurm_metering`).
    allocation = models.ForeignKey(
        "scheduler.Allocation",
        on_delete=models.PROTECT,
        related_name="usage_records",
        db_index=False,
    )
    job = models.ForeignKey(
        "scheduler.Job", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    project = models.ForeignKey(
        "portal.Project", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    account = models.ForeignKey(
        BillingAccount, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    gpu_model = models.ForeignKey("scheduler.GpuModel", on_delete=models.PROTECT, related_name="+")
    price_version = models.ForeignKey(PriceVersion, on_delete=models.PROTECT, related_name="+")
    period_start = models.DateField(help_text="First day of the UTC month the slice is in.")
    slice_start = models.DateTimeField()
    slice_end = models.DateTimeField()
    seconds = models.PositiveIntegerField()
    share_milli = models.PositiveIntegerField(help_text="Share as allocated.")
    billed_milli = models.PositiveIntegerField(help_text="Share of a whole GPU that is billed.")
    milli_seconds = models.BigIntegerField(help_text="seconds × billed_milli.")
    covered_milli_seconds = models.BigIntegerField(default=0, help_text="Covered by reservation.")
    tier = models.CharField(max_length=16, choices=Tier.choices)
    rate = models.DecimalField(max_digits=12, decimal_places=4, help_text="USD per GPU-hour.")
    gross_amount = models.DecimalField(max_digits=16, decimal_places=6)
    amount = models.DecimalField(
        max_digits=16, decimal_places=6, help_text="Billable: the uncovered part at the rate."
    )
    fault_credit = models.BooleanField(default=False, help_text="Credited by the fault policy.")
    invoice = models.ForeignKey(
        "Invoice",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="usage_records",
        db_index=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slice_start", "pk"]
        indexes = [
            models.Index(fields=["account", "period_start"], name="usage_account_period_idx"),
            models.Index(fields=["project", "period_start"], name="usage_project_period_idx"),
            models.Index(fields=["job"], name="usage_job_idx"),
            models.Index(fields=["invoice"], name="usage_invoice_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["allocation", "slice_start"],
                name="usage_unique_allocation_slice",
                violation_error_message="This slice of the allocation is already metered.",
            ),
            models.CheckConstraint(
                condition=models.Q(slice_end__gt=models.F("slice_start")),
                name="usage_slice_not_empty",
                violation_error_message="A usage slice ends after it starts.",
            ),
            models.CheckConstraint(
                condition=models.Q(covered_milli_seconds__gte=0)
                & models.Q(covered_milli_seconds__lte=models.F("milli_seconds")),
                name="usage_covered_within_usage",
                violation_error_message="Covered usage cannot exceed the usage.",
            ),
        ]

    def __str__(self) -> str:
        return f"alloc {self.allocation_id} {self.slice_start:%Y-%m-%d %H:%M:%S} {self.seconds}s"


class AllocationMeter(models.Model):
    """How far an allocation has been metered. An optimisation only: slices are deterministic,
    so a stale cursor re-meters nothing twice."""

    allocation = models.OneToOneField(
        "scheduler.Allocation", on_delete=models.CASCADE, primary_key=True, related_name="meter"
    )
    metered_until = models.DateTimeField()
    done = models.BooleanField(default=False)
    fault_credited = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"alloc {self.allocation_id} metered until {self.metered_until}"


class Invoice(models.Model):
    """One per account and month. Issued at the monthly close; totals are the sum of lines.
    Once issued, an invoice and its lines and records never change (a PostgreSQL trigger
    refuses it); late facts go on a later invoice as adjustments pointing here."""

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        OPEN = "open", "Open"
        PAID = "paid", "Paid"
        PAYMENT_FAILED = "payment_failed", "Payment failed"
        UNCOLLECTIBLE = "uncollectible", "Uncollectible"
        VOID = "void", "Void"
        NOTHING = "nothing", "Nothing to bill"

    account = models.ForeignKey(BillingAccount, on_delete=models.PROTECT, related_name="invoices")
    period_start = models.DateField()
    period_end = models.DateField(help_text="First day after the period.")
    number = models.CharField(
        max_length=32, unique=True, help_text="A placeholder until issued; then the issuer's next."
    )
    seller = models.JSONField(default=dict, blank=True, help_text="Issuer details at issue.")
    buyer = models.JSONField(default=dict, blank=True, help_text="Buyer details at issue.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    currency = models.CharField(max_length=3, default="usd")
    subtotal = models.DecimalField(max_digits=14, decimal_places=2, default=ZERO)
    credits_applied = models.DecimalField(max_digits=14, decimal_places=2, default=ZERO)
    tax_rate = models.DecimalField(max_digits=5, decimal_places=4, default=ZERO)
    tax = models.DecimalField(max_digits=14, decimal_places=2, default=ZERO)
    total = models.DecimalField(max_digits=14, decimal_places=2, default=ZERO)
    issued_at = models.DateTimeField(null=True, blank=True)
    emailed_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    payment_failed_at = models.DateTimeField(null=True, blank=True)
    stripe_invoice_id = models.CharField(max_length=64, blank=True)
    stripe_finalized = models.BooleanField(default=False)
    stripe_state_at = models.BigIntegerField(
        default=0, help_text="`created` of the newest Stripe event applied (out-of-order guard)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-period_start", "account__name"]
        constraints = [
            models.UniqueConstraint(
                fields=["account", "period_start"],
                name="invoice_unique_account_period",
                violation_error_message="This account already has an invoice for that month.",
            )
        ]

    def __str__(self) -> str:
        return self.number


UNISSUED_STATUSES = (Invoice.Status.DRAFT, Invoice.Status.NOTHING)


class InvoiceSequence(models.Model):
    """The issuer's invoice numbers: one sequence without gaps, taken in the issuing
    transaction (a rolled-back close gives its number back)."""

    issuer = models.CharField(max_length=32, unique=True)
    last = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.issuer} at {self.last}"


class InvoiceLine(models.Model):
    """One line: a reserved fee, covered or overage usage of one model at one rate, a credit,
    an adjustment or tax. Usage lines name the key that finds their records."""

    class Kind(models.TextChoices):
        RESERVED_FEE = "reserved_fee", "Reserved capacity fee"
        COVERED = "covered", "Usage covered by reservation"
        USAGE = "usage", "Pay-as-you-go usage"
        PREEMPTIBLE = "preemptible", "Preemptible usage"
        LATE_USAGE = "late_usage", "Usage of an earlier month"
        FAULT_CREDIT = "fault_credit", "Platform fault credit"
        ADJUSTMENT = "adjustment", "Adjustment"
        CREDITS = "credits", "Prepaid credits"
        TAX = "tax", "Tax"
        CARRIED = "carried", "Credit balance carried forward"
        STORAGE = "storage", "Storage (GB-months)"

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    description = models.CharField(max_length=300)
    gpu_model = models.ForeignKey(
        "scheduler.GpuModel", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    tier = models.CharField(max_length=16, blank=True)
    usage_period_start = models.DateField(null=True, blank=True)
    gpu_hours = models.DecimalField(max_digits=16, decimal_places=4, null=True, blank=True)
    unit_price = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    plan = models.ForeignKey(
        ReservedPlan, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    record_count = models.PositiveIntegerField(default=0)
    adjustment = models.ForeignKey(
        Adjustment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    stripe_item_id = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["invoice", "position"]
        constraints = [
            models.UniqueConstraint(
                fields=["invoice", "position"],
                name="invoice_line_unique_position",
                violation_error_message="Two lines cannot share a position.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.invoice_id}#{self.position} {self.description}"


class CreditApplication(models.Model):
    """Credits drawn from one grant by one invoice."""

    grant = models.ForeignKey(CreditGrant, on_delete=models.PROTECT, related_name="applications")
    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="credit_draws")
    amount = models.DecimalField(max_digits=12, decimal_places=2)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["grant", "invoice"],
                name="credit_application_unique",
                violation_error_message="This invoice already drew on this grant.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.amount} from grant {self.grant_id}"


class Budget(models.Model):
    """A project's monthly budget: notifications at 50/80/100 %, an optional hard cap."""

    project = models.OneToOneField(
        "portal.Project", on_delete=models.CASCADE, related_name="budget"
    )
    monthly_amount = models.DecimalField(
        max_digits=12, decimal_places=2, validators=[MinValueValidator(Decimal("0.01"))]
    )
    hard_cap = models.BooleanField(
        default=False,
        help_text="A job whose expected cost would take this month's spend past the budget is "
        "refused (a preemptible one may go on up to the allowance below).",
    )
    preemptible_allowance_percent = models.PositiveSmallIntegerField(
        default=10,
        validators=[MaxValueValidator(100)],
        help_text="Over a hard cap, preemptible work may spend this much more before all stops.",
    )
    alert_thresholds = models.JSONField(
        default=pricing.default_budget_thresholds,
        help_text="Percentages of the budget that notify the owners (set by them).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(monthly_amount__gt=0),
                name="budget_positive",
                violation_error_message="A budget is a positive amount.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.monthly_amount}/month for {self.project}"


class BudgetAlert(models.Model):
    """A threshold crossed in a month; unique so each is notified once."""

    project = models.ForeignKey("portal.Project", on_delete=models.CASCADE, related_name="+")
    period_start = models.DateField()
    threshold = models.PositiveSmallIntegerField()
    spent = models.DecimalField(max_digits=14, decimal_places=2)
    budget = models.DecimalField(max_digits=12, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "period_start", "threshold"],
                name="budget_alert_once",
                violation_error_message="This threshold was already notified this month.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.project} {self.threshold}% {self.period_start:%Y-%m}"


class Notification(models.Model):
    """An in-app billing notification for a project's members (shown on its pages; a notice
    by e-mail and webhook goes through portal/notify.py)."""

    class Level(models.TextChoices):
        INFO = "info", "Info"
        WARNING = "warning", "Warning"
        ERROR = "error", "Error"

    project = models.ForeignKey(
        "portal.Project", on_delete=models.CASCADE, related_name="billing_notifications"
    )
    kind = models.CharField(max_length=32)
    level = models.CharField(max_length=8, choices=Level.choices, default=Level.INFO)
    message = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return self.message


class StripeEvent(models.Model):
    """A verified webhook event; the unique id makes redelivery a no-op."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    created = models.BigIntegerField(help_text="Stripe's `created` (epoch seconds).")
    received_at = models.DateTimeField(auto_now_add=True)
    payload = models.JSONField(default=dict)
    outcome = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-received_at"]

    def __str__(self) -> str:
        return f"{self.type} {self.event_id}"


class ReservationRequest(models.Model):
    """An owner's request for a reserved plan; an operator approves (the plan is created and
    billed as reserved plans are) or declines it with a reason."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        DECLINED = "declined", "Declined"

    project = models.ForeignKey(
        "portal.Project", on_delete=models.CASCADE, related_name="reservation_requests"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    gpu_model = models.ForeignKey("scheduler.GpuModel", on_delete=models.PROTECT, related_name="+")
    gpus = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(4096)])
    term_months = models.PositiveSmallIntegerField(choices=ReservedPlan.Term.choices)
    justification = models.TextField(max_length=2000, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(max_length=2000, blank=True)
    plan = models.OneToOneField(
        ReservedPlan, null=True, blank=True, on_delete=models.SET_NULL, related_name="request"
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "created_at"], name="reservation_request_status")]

    def __str__(self) -> str:
        return f"Reservation request {self.pk} of {self.project} ({self.status})"

    def summary(self) -> str:
        return f"{self.gpus} × {self.gpu_model.name} for {self.term_months} months"


class MonthClose(models.Model):
    """One run of closing a month (billing/services/month_close.py): how far it got, and its
    summary at the end. Finance starts it from a page (a Celery task) or `manage.py close_month`."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    period_start = models.DateField()
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    total = models.PositiveIntegerField(null=True, blank=True, help_text="Accounts to close.")
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    summary = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-started_at", "-pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["period_start"],
                condition=models.Q(status="running"),
                name="month_close_one_running",
                violation_error_message="This month is already being closed.",
            )
        ]

    def __str__(self) -> str:
        return f"Close of {self.period_start:%Y-%m} ({self.status})"

    @property
    def processed(self) -> int:
        return self.done + self.failed

    @property
    def percent(self) -> int:
        return round(100 * self.processed / self.total) if self.total else 0

    def eta_seconds(self, now: Any) -> float | None:
        """Seconds left at the pace so far (None before the first account is through)."""
        if self.status != self.Status.RUNNING or not self.total or not self.processed:
            return None
        elapsed = (now - self.started_at).total_seconds()
        return elapsed * (self.total - self.processed) / self.processed


class StoragePrice(models.Model):
    """The price of storage per GB-month: a GiB of a volume's size limit held for a month of
    `pricing.STORAGE_MONTH_SECONDS` (730 hours). Versioned like GPU prices: the version in
    effect at a slice's start prices it."""

    effective_from = models.DateTimeField(unique=True)
    per_gib_month = models.DecimalField(
        max_digits=12, decimal_places=4, validators=[MinValueValidator(ZERO)]
    )
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-effective_from"]

    def __str__(self) -> str:
        return f"storage {self.per_gib_month}/GB-month from {self.effective_from:%Y-%m-%d}"


class StorageUsageRecord(models.Model):
    """One priced hour (or less, at a volume's creation or deletion) of a volume's size limit.
    Unique per volume and slice start: metering twice never double-counts. A dataset is one
    volume, so it is metered once however many jobs mount it."""

    volume = models.ForeignKey(
        "storage.Volume", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    project = models.ForeignKey(
        "portal.Project", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    account = models.ForeignKey(
        BillingAccount, on_delete=models.PROTECT, related_name="+", db_index=False
    )
    price = models.ForeignKey(StoragePrice, on_delete=models.PROTECT, related_name="+")
    period_start = models.DateField(help_text="First day of the UTC month the slice is in.")
    slice_start = models.DateTimeField()
    slice_end = models.DateTimeField()
    size_gib = models.PositiveIntegerField()
    gib_seconds = models.BigIntegerField(help_text="size_gib × seconds.")
    rate = models.DecimalField(max_digits=12, decimal_places=4, help_text="Per GB-month.")
    amount = models.DecimalField(max_digits=16, decimal_places=6)
    invoice = models.ForeignKey(
        "Invoice",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="storage_records",
        db_index=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slice_start", "pk"]
        indexes = [
            models.Index(fields=["project", "period_start"], name="storage_usage_project_idx"),
            models.Index(fields=["invoice"], name="storage_usage_invoice_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["volume", "slice_start"],
                name="storage_usage_unique_slice",
                violation_error_message="This slice of the volume is already metered.",
            ),
            models.CheckConstraint(
                condition=models.Q(slice_end__gt=models.F("slice_start")),
                name="storage_usage_slice_not_empty",
                violation_error_message="A usage slice ends after it starts.",
            ),
        ]

    def __str__(self) -> str:
        return f"volume {self.volume_id} {self.slice_start:%Y-%m-%d %H:%M} {self.size_gib} GiB"
