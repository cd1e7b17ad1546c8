"""WSGI entry point of the agent API pool (gunicorn -c deploy/gunicorn_agent.py config.wsgi_agent).

The same settings as the web tier, with the agent-only URL conf (config/urls_agent.py) and,
chosen by it, the agent pool's own middleware (`AGENT_POOL_MIDDLEWARE` in config/settings/base.py).
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
os.environ["PORTAL_URLCONF"] = "config.urls_agent"
application = get_wsgi_application()

# Every task registered now, as the worker boots, not by the first request that queues one
# (the apps must be loaded first).
from foundation.enqueue import tasks_import  # noqa: E402

tasks_import()
