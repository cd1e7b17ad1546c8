"""URL root of the agent API pool: only what node agents and load balancers call.

Served by its own gunicorn (`config.wsgi_agent`, its own port and workers) so that user
traffic, however heavy, cannot starve heartbeats and syncs: an overloaded web tier then slows
pages, not nodes, and no node is declared lost for the portal's own trouble.
"""

from django.urls import include, path

from portal import probes

urlpatterns = [
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("api/agent/v1/", include("scheduler.agent_api.urls")),
]
