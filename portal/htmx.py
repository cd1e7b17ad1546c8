"""One URL, one view: htmx requests get the partial, everything else the page around it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers

# A response status that makes htmx stop the element's `every` polling (it still swaps).
HTMX_STOP_POLLING = 286


def wants_partial(request: HttpRequest) -> bool:
    """An htmx request that swaps a fragment (a boosted navigation wants the whole page)."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted  # type: ignore[union-attr]


def render_partial_or_page(
    request: HttpRequest, *, page: str, partial: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """Render `partial` for htmx, else `page` (which includes it); responses vary on HX-Request."""
    template = partial if wants_partial(request) else page
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response
