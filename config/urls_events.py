"""URL root of the events service: only the pushed-updates stream (and the probes).

Served by uvicorn workers (`config.asgi_events`, `deploy/gunicorn_events.py`): an open page
holds one coroutine there, never a thread of the web tier's sync workers. The load balancer
sends `/events/` here.
"""

from django.urls import path

from portal import probes
from web import events

urlpatterns = [
    path("healthz", probes.healthz, name="healthz"),
    path("readyz", probes.readyz, name="readyz"),
    path("events/", events.events, name="events"),
    path("events/agent", events.agent_watch, name="events-agent"),
]
