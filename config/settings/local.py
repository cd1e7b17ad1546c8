"""`make run`: the embedded default (SQLite, a file broker, simulated nodes) on one laptop."""

import os

os.environ.setdefault("DJANGO_SECRET_KEY", "local-development-only-not-secret")
os.environ.setdefault("DJANGO_DEBUG", "true")

from config.settings.base import *  # noqa: F403

STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    # Web, worker, beat and agents share one SQLite file: wait for locks, write-ahead log.
    DATABASES["default"]["OPTIONS"] = {  # noqa: F405
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
