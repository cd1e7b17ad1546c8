"""Billing pages: usage and cost, budgets, invoices (and PDF), exports, operator revenue,
and the Stripe webhook endpoint."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing import exports, gateway, pricing, selectors, services
from billing.forms import BudgetForm
from billing.models import Invoice, InvoiceLine, MonthClose, UsageRecord
from billing.services import month_close
from portal.approvals import ask_from_post, decide_from_post
from portal.errors import DomainError, NotFound, PermissionDenied
from portal.forms import errors_in_words
from portal.htmx import HTMX_STOP_POLLING, render_partial_or_page, wants_partial
from portal.models import Project, Role, User
from portal.selectors import project_get_visible, project_role_of
from scheduler.core.cli import format_eta


def _user(request: HttpRequest) -> User:
    return request.user  # type: ignore[return-value]


def _month_nav(period: date) -> dict[str, str]:
    """Links to the month before and after; none after the month now running (nothing to
    show there yet)."""
    start, end = pricing.period_bounds(period)
    prev = pricing.month_start(start - timedelta(days=1))
    upcoming = end > timezone.now()
    return {
        "prev": f"{prev:%Y-%m}",
        "next": "" if upcoming else f"{end:%Y-%m}",
        "this": f"{start:%Y-%m}",
    }


@login_required
def usage(request: HttpRequest, slug: str) -> HttpResponse:
    project = project_get_visible(user=_user(request), slug=slug)
    period = selectors.month_param(request.GET.get("month"))
    summary = selectors.usage_summary(project=project, period_start=period)
    role = project_role_of(user=_user(request), project=project)
    budget = summary.budget
    form = BudgetForm(
        initial={
            "monthly_amount": budget.monthly_amount if budget else None,
            "hard_cap": budget.hard_cap if budget else False,
            "preemptible_allowance_percent": budget.preemptible_allowance_percent if budget else 10,
            "alert_thresholds": ", ".join(map(str, budget.alert_thresholds))
            if budget
            else "50, 80, 100",
        }
    )
    context = {
        "project": project,
        "summary": summary,
        "month": _month_nav(period),
        "is_owner": role == Role.OWNER,
        "form": form,
        "notifications": selectors.notification_list(project=project),
        "account": selectors.account_of(project=project),
    }
    return render_partial_or_page(
        request,
        page="billing/usage.html",
        partial="billing/partials/_usage_tables.html",
        context=context,
    )


@login_required
@require_POST
def budget_update(request: HttpRequest, slug: str) -> HttpResponse:
    project = project_get_visible(user=_user(request), slug=slug)
    form = BudgetForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"The budget was not saved: {errors_in_words(form)}")
        return redirect("billing:usage", slug=project.slug)
    try:
        if request.POST.get("remove"):
            services.budget_remove(actor=_user(request), project=project)
            messages.success(request, "Budget removed.")
        else:
            services.budget_set(actor=_user(request), project=project, **form.cleaned_data)
            messages.success(request, "Budget saved.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("billing:usage", slug=project.slug)


@login_required
def invoices(request: HttpRequest, slug: str) -> HttpResponse:
    project = project_get_visible(user=_user(request), slug=slug)
    return render(
        request,
        "billing/invoices.html",
        {"project": project, "invoices": selectors.invoice_list_for_project(project=project)},
    )


@login_required
def invoice_detail(request: HttpRequest, invoice_id: int) -> HttpResponse:
    from billing.documents import invoice_context

    invoice = selectors.invoice_get_visible(user=_user(request), invoice_id=invoice_id)
    return render(request, "billing/invoice_detail.html", invoice_context(invoice))


@login_required
def invoice_line(request: HttpRequest, invoice_id: int, line_id: int) -> HttpResponse:
    """The usage records behind one line (an htmx partial)."""
    invoice = selectors.invoice_get_visible(user=_user(request), invoice_id=invoice_id)
    line = InvoiceLine.objects.filter(invoice=invoice, pk=line_id).select_related("invoice").first()
    if line is None:
        raise NotFound("No such invoice line.")
    records = selectors.line_records(line=line)
    return render(
        request,
        "billing/partials/_line_records.html",
        {"line": line, "records": records[:500], "count": records.count()},
    )


@login_required
def invoice_pdf(request: HttpRequest, invoice_id: int) -> HttpResponse:
    invoice = selectors.invoice_get_visible(user=_user(request), invoice_id=invoice_id)
    response = HttpResponse(services.invoice_pdf(invoice=invoice), content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{invoice.number}.pdf"'
    return response


def _export(request: HttpRequest, slug: str, kind: str) -> StreamingHttpResponse:
    project = project_get_visible(user=_user(request), slug=slug)
    period = selectors.month_param(request.GET.get("month"))
    records = selectors.usage_records_for_export(project=project, period_start=period).iterator(
        chunk_size=2000
    )
    if kind == "focus":
        lines = exports.csv_lines(exports.FOCUS_COLUMNS, _focus_rows(project, period, records))
    else:
        storage = selectors.storage_records_for_csv(project=project, period_start=period)
        lines = exports.csv_lines(
            exports.CSV_COLUMNS,
            itertools.chain(
                exports.usage_csv_rows(records),
                exports.storage_csv_rows(storage.iterator(chunk_size=2000)),
            ),
        )
    response = StreamingHttpResponse(lines, content_type="text/csv")
    suffix = "focus" if kind == "focus" else "usage"
    response["Content-Disposition"] = (
        f'attachment; filename="{project.slug}-{period:%Y-%m}-{suffix}.csv"'
    )
    return response


def _focus_rows(
    project: Project, period: date, records: Iterator[UsageRecord]
) -> Iterator[list[Any]]:
    """The month's FOCUS rows: its issued invoice's (which reconcile with it, account-wide as
    the invoice is), or the project's usage so far on the open month's draft."""
    invoice = selectors.invoice_of_month(project=project, period_start=period)
    if invoice is None:
        return iter(())
    if invoice.status == Invoice.Status.DRAFT:
        storage = selectors.storage_records_for_export(
            project=project, period_start=period, invoice=invoice
        )
        return exports.focus_rows_open_month(invoice, records, storage)
    return exports.focus_rows_for_invoice(invoice)


@login_required
def invoice_focus(request: HttpRequest, invoice_id: int) -> StreamingHttpResponse:
    invoice = selectors.invoice_get_visible(user=_user(request), invoice_id=invoice_id)
    response = StreamingHttpResponse(
        exports.csv_lines(exports.FOCUS_COLUMNS, exports.focus_rows_for_invoice(invoice)),
        content_type="text/csv",
    )
    response["Content-Disposition"] = f'attachment; filename="{invoice.number}-focus.csv"'
    return response


@login_required
def usage_csv(request: HttpRequest, slug: str) -> StreamingHttpResponse:
    return _export(request, slug, "csv")


@login_required
def usage_focus(request: HttpRequest, slug: str) -> StreamingHttpResponse:
    return _export(request, slug, "focus")


@login_required
def revenue(request: HttpRequest) -> HttpResponse:
    if not _user(request).is_staff:
        raise PermissionDenied("The revenue view is for operators.")
    period = selectors.month_param(request.GET.get("month"))
    rows = selectors.revenue_by_model(period_start=period)
    totals = {
        "hours": sum((r.gpu_hours_sold for r in rows), pricing.ZERO),
        "usage": sum((r.usage_revenue for r in rows), pricing.ZERO),
        "reserved": sum((r.reserved_revenue for r in rows), pricing.ZERO),
        "revenue": sum((r.revenue for r in rows), pricing.ZERO),
    }
    return render(
        request,
        "billing/revenue.html",
        {"rows": rows, "totals": totals, "month": _month_nav(period), "period": period},
    )


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    """Stripe calls this; the signature, not a session or CSRF token, authenticates it."""
    try:
        event = gateway.event_verify(
            payload=request.body, signature=request.headers.get("Stripe-Signature", "")
        )
    except gateway.SignatureError as exc:
        return JsonResponse({"detail": f"Signature check failed: {exc}"}, status=400)
    try:
        outcome = services.stripe_event_apply(event=event)
    except DomainError as exc:
        return JsonResponse({"detail": exc.message}, status=400)
    return JsonResponse({"received": True, "outcome": outcome})


# ---- reserved plans by request (billing/reservation_requests.py) ------------------------------


@login_required
@require_POST
def reservation_request_new(request: HttpRequest, slug: str) -> HttpResponse:
    from billing import reservation_requests
    from billing.forms import ReservationRequestForm

    return ask_from_post(
        request,
        project=project_get_visible(user=_user(request), slug=slug),
        form=ReservationRequestForm(request.POST),
        create=reservation_requests.reservation_request_create,
        sent="Reservation request sent to the operators.",
    )


@login_required
@require_POST
def reservation_request_decide(request: HttpRequest, request_id: int) -> HttpResponse:
    from billing import reservation_requests
    from scheduler.forms import DecisionForm

    if not _user(request).is_staff:
        raise PermissionDenied("Operators only.")
    return decide_from_post(
        request,
        request_id=request_id,
        form=DecisionForm(request.POST),
        approve=reservation_requests.reservation_request_approve,
        decline=reservation_requests.reservation_request_decline,
        approved="Approved: the reserved plan starts now.",
    )


# ---- closing a month, for finance (billing/services/month_close.py) ------------------------


@login_required
def month_close_page(request: HttpRequest) -> HttpResponse:
    """Start a month's close (a Celery task) and see the recent ones."""
    if not _user(request).is_staff:
        raise PermissionDenied("Closing a month is for finance staff.")
    if request.method == "POST":
        try:
            period = selectors.month_param(request.POST.get("month"))
            run = month_close.month_close_start(actor=_user(request), period_start=period)
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            return redirect("billing:month-close-detail", close_id=run.pk)
    last_month = services.previous_period()
    return render(
        request,
        "billing/month_close.html",
        {"runs": MonthClose.objects.select_related("started_by")[:20], "last_month": last_month},
    )


@login_required
def month_close_detail(request: HttpRequest, close_id: int) -> HttpResponse:
    """One close: accounts done / total and the ETA while it runs (polled), then its summary."""
    if not _user(request).is_staff:
        raise PermissionDenied("Closing a month is for finance staff.")
    run = MonthClose.objects.filter(pk=close_id).select_related("started_by").first()
    if run is None:
        raise NotFound("No such close.")
    eta = run.eta_seconds(timezone.now())
    finished = run.status != MonthClose.Status.RUNNING
    return render_partial_or_page(
        request,
        page="billing/month_close_detail.html",
        partial="billing/partials/_month_close_progress.html",
        context={"run": run, "eta": None if eta is None else format_eta(eta)},
        status=HTMX_STOP_POLLING if finished and wants_partial(request) else 200,
    )
