"""`make test`: real PostgreSQL and Redis (scripts/test.sh provides them)."""

import os
import tempfile

os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-not-secret")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")

from config.settings.base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# The suite's operators sign in with `force_login` and no phone; the two-factor rule is tested
# with it on (tests/portal/test_two_factor.py), and so does the authorization matrix.
OTP_REQUIRED_FOR_STAFF = False
# One test run (and the processes it starts) shares a prefix that no other run uses.
TEST_RUN_ID = os.environ.setdefault("TEST_RUN_ID", str(os.getpid()))
CACHES["default"]["KEY_PREFIX"] = f"test-{TEST_RUN_ID}"  # noqa: F405
# Live telemetry too: two runs (or benchmark stacks) on one Redis never read each other's GPUs.
MONITORING_KEY_PREFIX = os.environ.get("MONITORING_KEY_PREFIX") or f"mon-{TEST_RUN_ID}"
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
# Broker keys of this test run cannot be taken by another run on the same Redis.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,  # noqa: F405
    "global_keyprefix": f"test-{TEST_RUN_ID}-",
}
PROVISIONING_SPAWN_AGENTS = False  # tests start agents themselves

# Webhook tests post to a receiver on loopback and see its retries within a second.
WEBHOOK_ALLOW_PRIVATE_HOSTS = True
WEBHOOK_RETRY_SECONDS = 0.2
WEBHOOK_MAX_ATTEMPTS = 3

# Storage: dataset imports come from a server on loopback; files land in this run's directory.
STORAGE_IMPORT_ALLOW_PRIVATE_HOSTS = True
STORAGE_SHARED_ROOT = os.environ.get("STORAGE_SHARED_ROOT") or os.path.join(
    tempfile.gettempdir(), f"gpucloud-shared-storage-{TEST_RUN_ID}"
)
