"""The OpenAPI schema and docs are served locally, with no CDN."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_schema_lists_the_endpoints(make_user, client):
    client.force_login(make_user())
    schema = client.get("/api/schema/?format=json").json()
    paths = set(schema["paths"])
    assert {
        "/api/v1/projects/",
        "/api/v1/projects/{slug}/",
        "/api/v1/projects/{project_slug}/members/",
        "/api/v1/gpu-models/",
        "/api/v1/tokens/",
        "/api/v1/tokens/{id}/",
    } <= paths
    assert "bearerAuth" in schema["components"]["securitySchemes"]


def test_docs_page_uses_no_cdn(make_user, client):
    client.force_login(make_user())
    html = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower() and "unpkg" not in html.lower()


def test_pages_use_no_cdn(make_user, client):
    client.force_login(make_user())
    html = client.get("/").content.decode()
    assert "htmx" in html and "//cdn" not in html and "unpkg" not in html
