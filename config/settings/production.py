"""Production: every secret from the environment, HTTPS only, PostgreSQL and Redis required."""

from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *  # noqa: F403
from config.settings.base import env, health_checked_backend, prepared_statements

DEBUG = False
# The embedded fallbacks (a file cache, a broker in local files) are for one machine: several
# web processes and workers need the one Redis, and a Redis reachable by anything on the
# network needs a password.
if not REDIS_URL:  # noqa: F405
    raise ImproperlyConfigured(
        "Production needs REDIS_URL (redis://:PASSWORD@host:6379/0) for the cache, the broker and "
        "locks; the embedded file cache and broker serve one machine only."
    )
if not urlsplit(REDIS_URL).password:  # noqa: F405
    raise ImproperlyConfigured(
        "REDIS_URL has no password; production Redis must require one (redis://:PASSWORD@host)."
    )
LOGGING["handlers"]["console"]["formatter"] = env("LOG_FORMAT", default="json")  # type: ignore[index]  # noqa: F405
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]  # load balancers probe over plain HTTP
DATABASES = {"default": env.db("DATABASE_URL")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=60)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
prepared_statements(DATABASES["default"])
health_checked_backend(DATABASES["default"])

SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
