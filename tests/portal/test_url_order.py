"""The API's patterns come first in the URL root (agents' syncs and heartbeats and submissions
skip the pages' patterns); that is only safe while no later pattern could be shadowed."""

from __future__ import annotations

from django.urls import get_resolver, resolve

API_PREFIXES = ("api/agent/v1/", "api/v1/")


def test_no_pattern_after_the_api_block_is_under_its_prefixes():
    patterns = get_resolver().url_patterns
    routes = [str(p.pattern) for p in patterns]
    api = [i for i, r in enumerate(routes) if r.startswith(API_PREFIXES)]
    assert api == list(range(len(api))), "the API block is not at the head of the URL root"
    shadowed = [r for r in routes[len(api) :] if r.startswith(API_PREFIXES)]
    assert shadowed == []


def test_api_and_pages_resolve_to_their_views():
    assert resolve("/api/agent/v1/sync").url_name == "agent-sync"
    assert resolve("/api/v1/jobs").url_name == "api-job-list"
    assert resolve("/api/v1/billing/invoices/7").url_name == "api-billing-invoice"
    assert resolve("/").url_name == "home"
    assert resolve("/api/docs/").url_name == "api-docs"
