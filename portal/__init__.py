"""Tenancy: users, projects, memberships, API tokens and audit events, plus the shared web plumbing
(middleware, htmx helpers, rate limits, API base classes) every app builds on. Imports none of ours."""
