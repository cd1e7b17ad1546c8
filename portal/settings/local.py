"""`make run`: the embedded default (SQLite, a file broker, simulated nodes) on one laptop."""

import os

os.environ.setdefault("DJANGO_SECRET_KEY", "local-development-only-not-secret")
os.environ.setdefault("DJANGO_DEBUG", "true")

from portal.settings.base import *  # noqa: F403

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
