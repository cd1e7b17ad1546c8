"""WSGI entry point (gunicorn config.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
application = get_wsgi_application()

# Every task registered now, as the worker boots, not by the first request that queues one
# (the apps must be loaded first).
from foundation.enqueue import tasks_import  # noqa: E402

tasks_import()
