"""Navigation context: the projects a user may switch between and the current one."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest

from portal.selectors import project_list_visible_to


def navigation(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"signup_open": settings.SIGNUP_OPEN, "oidc_enabled": settings.OIDC_ENABLED}
    projects = list(project_list_visible_to(user=user).only("slug", "name")[:50])
    slug = getattr(request, "current_project_slug", None)
    current = next((p for p in projects if p.slug == slug), projects[0] if projects else None)
    return {"nav_projects": projects, "current_project": current}
