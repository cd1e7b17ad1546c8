"""The test suite's embedded lane: `make run`'s default (SQLite, a file cache, a file broker).

`scripts/test.sh` runs `tests/embedded` under these settings after the main suite, so the
generic fallbacks that stand in for PostgreSQL- and Redis-only fast paths run in CI too.
"""

import os
import tempfile

os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-not-secret")
os.environ["DATABASE_URL"] = "sqlite:///embedded-test.sqlite3"  # the test database is in memory
os.environ["REDIS_URL"] = ""  # no Redis: the file cache, the file broker, cache-based locks

from config.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
_scratch = tempfile.mkdtemp(prefix="gpuportal-embedded-")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": os.path.join(_scratch, "cache"),
    }
}
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,  # noqa: F405
    "data_folder_in": os.path.join(_scratch, "broker"),
    "data_folder_out": os.path.join(_scratch, "broker"),
    "processed_folder": os.path.join(_scratch, "broker-processed"),
    "control_folder": os.path.join(_scratch, "broker-control"),
}
for _folder in ("broker", "broker-processed", "broker-control"):
    os.makedirs(os.path.join(_scratch, _folder), exist_ok=True)
PROVISIONING_SPAWN_AGENTS = False
WHITENOISE_USE_FINDERS = True
