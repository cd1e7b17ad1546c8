"""ASGI entry point of the events service (gunicorn -c deploy/gunicorn_events.py config.asgi_events).

The same settings as the web tier, with the events-only URL conf (config/urls_events.py).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
os.environ["PORTAL_URLCONF"] = "config.urls_events"
application = get_asgi_application()
