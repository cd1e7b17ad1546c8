"""Pages of the scheduler app: the GPU catalog."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.vary import vary_on_headers

from portal.errors import DomainError
from scheduler.models import PRECISIONS
from scheduler.selectors import CatalogFilter, gpu_model_list


@login_required
@vary_on_headers("HX-Request")
def catalog(request: HttpRequest) -> HttpResponse:
    error = None
    try:
        filters = CatalogFilter.parse(request.GET.dict())
    except DomainError as exc:
        error, filters = exc.message, CatalogFilter()
    context = {
        "gpu_models": gpu_model_list(filters=filters),
        "filters": filters,
        "precisions": PRECISIONS,
        "memory_choices": [16, 24, 40, 48, 80, 141],
        "error": error,
    }
    htmx = getattr(request, "htmx", None)
    if htmx and not htmx.boosted:
        return render(request, "scheduler/partials/_catalog_table.html", context)
    return render(request, "scheduler/catalog.html", context, status=400 if error else 200)
