"""ASGI entry point (e.g. `uvicorn config.asgi:application`)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
application = get_asgi_application()

# Every task registered now, as the worker boots, not by the first request that queues one.
from foundation.enqueue import tasks_import  # noqa: E402

tasks_import()
