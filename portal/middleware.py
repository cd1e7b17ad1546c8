"""Request plumbing: the current project for the switcher, and domain errors as 4xx pages."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.errors import DomainError

SESSION_KEY = "current_project"


class CurrentProjectMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.current_project_slug = (  # type: ignore[attr-defined]
            request.session.get(SESSION_KEY) if hasattr(request, "session") else None
        )
        return self.get_response(request)


class DomainErrorMiddleware:
    """Pages: a DomainError raised by a service becomes a 4xx page with its message."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DomainError):
            return None
        return render(
            request,
            "error.html",
            {"status": exception.status, "message": exception.message},
            status=exception.status,
        )
