"""Settings shared by every environment, read from the environment with django-environ."""

import math
from pathlib import Path
from typing import Any

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

SECRET_KEY = env("DJANGO_SECRET_KEY")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "portal",
    "scheduler",
    "storage",
    "billing",
    "monitoring",
    "web",
]

MIDDLEWARE = [
    "portal.logs.RequestIdMiddleware",
    "foundation.clientip.ClientAddressMiddleware",  # everything below sees the real client
    "django.middleware.security.SecurityMiddleware",
    "portal.middleware.SecurityHeadersMiddleware",
    "portal.middleware.RequestContextMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "portal.middleware.SessionIdleTimeoutMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "portal.middleware.StaffTwoFactorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "portal.middleware.CurrentProjectMiddleware",
    "portal.middleware.DomainErrorMiddleware",
]

# The agent API pool runs with its own URL conf (config/wsgi_agent.py sets it).
ROOT_URLCONF = env("PORTAL_URLCONF", default="config.urls")
# ...and its own middleware: node agents authenticate with a node token in every request and
# load balancers probe; neither has a session, a CSRF cookie, a page or a static file, so none
# of the web's session, CSRF, login, two-factor, messages, htmx, project or WhiteNoise layers
# runs there (bench.agent_cost). What stays: the request id, the client's address behind
# trusted proxies (throttles, audit events), HTTPS and the security headers, ALLOWED_HOSTS and
# Content-Length (CommonMiddleware). Errors are answered by DRF's handler
# (portal/api/errors.py), as on the web tier.
AGENT_POOL_MIDDLEWARE = [
    "portal.logs.RequestIdMiddleware",
    "foundation.clientip.ClientAddressMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "portal.middleware.SecurityHeadersMiddleware",
    "portal.middleware.RequestContextMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
if ROOT_URLCONF == "config.urls_agent":
    MIDDLEWARE = AGENT_POOL_MIDDLEWARE
    # The admin's checks ask for sessions, login and messages, which the admin needs; this
    # pool serves no admin page. CSRF protects cookie sessions, and no request here has one.
    SILENCED_SYSTEM_CHECKS = ["admin.E408", "admin.E409", "admin.E410", "security.W003"]
WSGI_APPLICATION = "config.wsgi.application"
AUTH_USER_MODEL = "portal.User"
# Every login path checks the lockout (portal/auth_events.py); OIDC adds its backend below.
# Every login path checks the lockout (portal/auth_events.py).
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.navigation",
            ],
            # `money`: how every amount is written (portal/money.py)
            "builtins": ["portal.templatetags.money"],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
# Persistent connections: a new PostgreSQL connection per request costs more than most requests.
# 0 (a connection per request) unless the deployment sets it; production defaults to 60 s.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DB_CONN_MAX_AGE", default=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True


def prepared_statements(database: dict[str, Any]) -> None:
    """PostgreSQL: bind parameters on the server and prepare a statement the fifth time a
    connection runs it, so PostgreSQL stops parsing and planning the same statements (a third
    of its CPU per submission). Django leaves this off for transaction-pooling PgBouncers older
    than 1.21; such a deployment sets DB_PREPARED_STATEMENTS=false."""
    if database["ENGINE"].endswith("postgresql") and env.bool(
        "DB_PREPARED_STATEMENTS", default=True
    ):
        database.setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)


def health_checked_backend(database: dict[str, Any]) -> None:
    """PostgreSQL: the portal's backend (foundation/db_backends/postgresql), whose health check at the
    first query of each request looks at the connection's socket instead of running `SELECT 1`,
    a round trip per request. Its name still ends in "postgresql", as checks like the one above
    expect, and Django reports its vendor as "postgresql"."""
    if database["ENGINE"] == "django.db.backends.postgresql":
        database["ENGINE"] = "foundation.db_backends.postgresql"


prepared_statements(DATABASES["default"])
health_checked_backend(DATABASES["default"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL", default="")
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "foundation.cache.RedisCache",  # reuses its redis client (foundation/cache.py)
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env("CACHE_KEY_PREFIX", default="portal"),
        }
    }
else:
    # Embedded default: a cache every local process shares, without a Redis server.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(BASE_DIR / "var" / "cache"),
        }
    }

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_AGE = env.int("SESSION_COOKIE_AGE", default=12 * 3600)
# A session unused this long ends (each request renews it); SESSION_COOKIE_AGE caps it in all.
SESSION_IDLE_SECONDS = env.int("SESSION_IDLE_SECONDS", default=3600)
# Proxies whose X-Forwarded-For is believed (addresses or CIDR networks; none by default).
TRUSTED_PROXIES = env.list("TRUSTED_PROXIES", default=[])
# Login throttling, on every login path (page, admin, API): this many failures for one account
# from one client address lock that pair out this long; LOGIN_ACCOUNT_FAILURE_LIMIT failures
# for one account from anywhere lock the account. Attempts per address are rate-limited.
LOGIN_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
LOGIN_ACCOUNT_FAILURE_LIMIT = env.int("LOGIN_ACCOUNT_FAILURE_LIMIT", default=50)
LOGIN_LOCKOUT_SECONDS = env.int("LOGIN_LOCKOUT_SECONDS", default=900)
LOGIN_RATE = env("LOGIN_RATE", default="30/min")
# Jobs one project may have waiting in the queue; a submit past it is refused (429).
PROJECT_MAX_QUEUED_JOBS = env.int("PROJECT_MAX_QUEUED_JOBS", default=10_000)
METRICS_RATE = env("METRICS_RATE", default="120/min")
# Self-service accounts (portal/accounts.py). Sign-up is by invitation; an operator may open it
# to anyone with a verified e-mail address.
SIGNUP_OPEN = env.bool("SIGNUP_OPEN", default=False)
INVITATION_TTL_DAYS = env.int("INVITATION_TTL_DAYS", default=7)
# Project webhooks (portal/notify.py): attempts per notice, the first retry's delay (doubling
# after), and whether a webhook may point at a private or loopback address (off: no SSRF).
WEBHOOK_MAX_ATTEMPTS = env.int("WEBHOOK_MAX_ATTEMPTS", default=6)
WEBHOOK_RETRY_SECONDS = env.float("WEBHOOK_RETRY_SECONDS", default=30.0)
WEBHOOK_TIMEOUT_SECONDS = env.float("WEBHOOK_TIMEOUT_SECONDS", default=5.0)
WEBHOOK_ALLOW_PRIVATE_HOSTS = env.bool("WEBHOOK_ALLOW_PRIVATE_HOSTS", default=False)
# Links in e-mails that verify an address (sign-up, e-mail change) are valid this long.
EMAIL_LINK_MAX_AGE_SECONDS = env.int("EMAIL_LINK_MAX_AGE_SECONDS", default=2 * 86400)
PASSWORD_RESET_TIMEOUT = env.int("PASSWORD_RESET_TIMEOUT", default=3600)
# Per client address: password reset, sign-up and e-mail change requests (they send e-mail).
ACCOUNT_EMAIL_RATE = env("ACCOUNT_EMAIL_RATE", default="5/hour")
# Operators (staff) sign in with a TOTP code too (django-otp); one without a device is sent to
# set one up before any page. Off only where no operator signs in (the test suite's fixtures).
OTP_REQUIRED_FOR_STAFF = env.bool("OTP_REQUIRED_FOR_STAFF", default=True)
OTP_TOTP_ISSUER = env("OTP_TOTP_ISSUER", default="GPU Cloud")
# Optional single sign-on through OpenID Connect (mozilla-django-oidc): on when a client id is set.
OIDC_RP_CLIENT_ID = env("OIDC_RP_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = env("OIDC_RP_CLIENT_SECRET", default="")
OIDC_RP_SIGN_ALGO = env("OIDC_RP_SIGN_ALGO", default="RS256")
OIDC_OP_AUTHORIZATION_ENDPOINT = env("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env("OIDC_OP_USER_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env("OIDC_OP_JWKS_ENDPOINT", default="")
OIDC_RP_SCOPES = "openid email profile"
# A first OIDC sign-in creates an account only where open sign-up is on; otherwise the address
# must already have one (by invitation). The provider must vouch for the address.
OIDC_CREATE_USER = env.bool("OIDC_CREATE_USER", default=SIGNUP_OPEN)
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
AUTHENTICATION_BACKENDS = ["portal.auth_events.ThrottledModelBackend"]  # the lockout on every path
if OIDC_ENABLED:
    INSTALLED_APPS.append("mozilla_django_oidc")
    AUTHENTICATION_BACKENDS.append("portal.oidc.EmailOIDCBackend")
    LOGIN_REDIRECT_URL_FAILURE = "/login/"
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "portal.authentication.TokenScopePermission",
    ],
    "DEFAULT_SCHEMA_CLASS": "portal.api.schema.PortalAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
    # REMOTE_ADDR is already the client (foundation.clientip), so DRF must not read the header.
    "NUM_PROXIES": 0,
    "DEFAULT_THROTTLE_CLASSES": [
        "foundation.ratelimit.FixedWindowAnonThrottle",
        "foundation.ratelimit.FixedWindowUserThrottle",
    ],
    # Fixed windows, one Redis round trip per check (foundation/ratelimit.py). Expensive endpoints
    # have their own scopes (FixedWindowScopedThrottle on those views); RATE_SUBMIT is per user.
    "DEFAULT_THROTTLE_RATES": {
        "anon": env("RATE_ANON", default="120/min"),
        "user": env("RATE_USER", default="6000/min"),
        "submit": env("RATE_SUBMIT", default="1200/min"),
        "dry_run": env("RATE_DRY_RUN", default="120/min"),
        # "agent", "agent_heartbeat", "agent_logs": set below, from the agents' intervals
    },
    # DRF's JSON classes through orjson where it gives the same result (foundation/fastjson.py).
    "DEFAULT_RENDERER_CLASSES": [
        "foundation.fastjson.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": [
        "foundation.fastjson.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Cloud Portal API",
    "DESCRIPTION": "Projects, GPU catalog, API tokens, jobs and billing of the GPU cloud portal.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "VolumeKindEnum": "storage.models.VolumeKind",
    },
    # The docs page lists the groups in this order (portal.api.schema.PortalAutoSchema.get_tags).
    "TAGS": [
        {
            "name": "Portal API",
            "description": "Projects, jobs, GPU catalog, tokens, usage: authenticate with an "
            "API token (Authorization: Bearer gpc_…).",
        },
        {
            "name": "Node agents (internal)",
            "description": "What the node agents call with their node tokens; not for people.",
        },
    ],
}

# Celery: Redis when configured, else a broker in local files so `make run` needs no server.
if REDIS_URL:
    CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {"visibility_timeout": 3600}
else:
    _broker_dir = BASE_DIR / "var" / "broker"
    CELERY_BROKER_URL = "filesystem://"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir),
        "data_folder_out": str(_broker_dir),
        "processed_folder": str(BASE_DIR / "var" / "broker-processed"),
        "control_folder": str(BASE_DIR / "var" / "broker-control"),
        "store_processed": False,
    }
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 600
CELERY_TASK_SOFT_TIME_LIMIT = 540
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TIMEZONE = "UTC"
# Celery's Django fixup closes every database connection before and after each task unless
# this is set: a new PostgreSQL backend for every scheduling cycle. Set, it closes them only
# every 2 × this many tasks; `config/celery.py` closes them as Django does after a request
# (past CONN_MAX_AGE, or unusable), so with CONN_MAX_AGE = 0 that is still after every task.
CELERY_DB_REUSE_MAX = 1_000_000

EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="GPU Cloud <billing@gpucloud.example>")

LOG_FORMAT = env("LOG_FORMAT", default="text")  # "json": one JSON object a line
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "portal.logs.RequestIdFilter"}},
    "formatters": {
        "json": {"()": "portal.logs.JsonFormatter"},
        "text": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["request_id"],
            "formatter": "json" if LOG_FORMAT == "json" else "text",
        }
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# Scheduler
SCHEDULER_CYCLE_SECONDS = env.float("SCHEDULER_CYCLE_SECONDS", default=3.0)
PREEMPTIBLE_DISCOUNT = env.float("PREEMPTIBLE_DISCOUNT", default=0.6)
NODE_HEARTBEAT_SECONDS = env.float("NODE_HEARTBEAT_SECONDS", default=5.0)
NODE_LOST_AFTER_SECONDS = env.float("NODE_LOST_AFTER_SECONDS", default=60.0)
# A gang's MASTER_PORT is one of these ports on rank 0's node (scheduler/gangs.py): keep the
# range free of other listeners on GPU hosts.
GANG_PORT_BASE = env.int("GANG_PORT_BASE", default=29400)
GANG_PORT_COUNT = env.int("GANG_PORT_COUNT", default=600)
# When more than this fraction of the nodes that should heartbeat (and at least the minimum
# count) fall silent in the same sweep, the portal suspects itself or the network between, not
# the nodes: it declares none lost and says so on the nodes page until heartbeats return.
NODE_EVICTION_RATE = env.float("NODE_EVICTION_RATE", default=0.5)  # nodes/s, a normal pool
NODE_EVICTION_BURST = env.int("NODE_EVICTION_BURST", default=5)  # declared at once at most
NODE_EVICTION_SECONDARY_RATE = env.float("NODE_EVICTION_SECONDARY_RATE", default=0.01)
NODE_EVICTION_UNHEALTHY_THRESHOLD = env.float("NODE_EVICTION_UNHEALTHY_THRESHOLD", default=0.55)
NODE_EVICTION_MIN_UNHEALTHY = env.int("NODE_EVICTION_MIN_UNHEALTHY", default=3)
NODE_EVICTION_LARGE_POOL = env.int("NODE_EVICTION_LARGE_POOL", default=50)
AGENT_POLL_SECONDS = env.float("AGENT_POLL_SECONDS", default=2.0)
# The agent throttle, per node: what an agent needs at the intervals the portal gives it, times
# AGENT_RATE_MARGIN. A heartbeat every NODE_HEARTBEAT_SECONDS; a sync every AGENT_POLL_SECONDS
# and at most one more per poll for the starts it led to (exits, register and the old
# one-per-report endpoints fit in the margin). Log chunks have their own window, so output can
# never throttle a heartbeat away; they are bounded per job by the log quota as well.
AGENT_RATE_MARGIN = env.float("AGENT_RATE_MARGIN", default=4.0)
AGENT_HEARTBEATS_PER_MIN = 60 / max(NODE_HEARTBEAT_SECONDS, 0.05)
AGENT_SYNCS_PER_MIN = 2 * 60 / max(AGENT_POLL_SECONDS, 0.05)
REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"].update(  # type: ignore[attr-defined]
    {
        "agent": env(
            "RATE_AGENT", default=f"{math.ceil(AGENT_SYNCS_PER_MIN * AGENT_RATE_MARGIN)}/min"
        ),
        "agent_heartbeat": env(
            "RATE_AGENT_HEARTBEAT",
            default=f"{math.ceil(AGENT_HEARTBEATS_PER_MIN * AGENT_RATE_MARGIN)}/min",
        ),
        "agent_logs": env("RATE_AGENT_LOGS", default="1200/min"),
    }
)
# A GPU fault is credited once a sample this much later still finds the GPU unhealthy (or an
# operator confirms it): one forged XID in one heartbeat credits nothing.
GPU_FAULT_CORROBORATION_SECONDS = env.float("GPU_FAULT_CORROBORATION_SECONDS", default=30.0)
# Registries jobs' images may come from, besides those operators add (scheduler.AllowedRegistry).
IMAGE_REGISTRIES = env.list(
    "IMAGE_REGISTRIES", default=["docker.io", "ghcr.io", "localhost", "nvcr.io", "registry.k8s.io"]
)
# Output kept per job unless its project's quota says otherwise (Quota.log_quota_bytes).
JOB_LOG_QUOTA_BYTES = env.int("JOB_LOG_QUOTA_BYTES", default=16 * 1024 * 1024)
SCHEDULER_SYNC_CYCLE = env.bool("SCHEDULER_SYNC_CYCLE", default=False)

CELERY_TASK_ROUTES = {
    # mail, webhooks and page caches: not on the cycle's queue
    "scheduler.job_notices": {"queue": "default"},
    "scheduler.model_availability_refresh": {"queue": "default"},
    "scheduler.*": {"queue": "scheduler"},
    "provisioning.*": {"queue": "provisioning"},
    "telemetry.*": {"queue": "telemetry"},
    "billing.*": {"queue": "billing"},
    "storage.*": {"queue": "default"},
}
CELERY_BEAT_SCHEDULE = {
    "scheduling-cycle": {
        "task": "scheduler.cycle",
        "schedule": SCHEDULER_CYCLE_SECONDS,
        "options": {"expires": SCHEDULER_CYCLE_SECONDS * 2},
    },
    "node-health-sweep": {
        "task": "scheduler.health_sweep",
        "schedule": 10.0,
        "options": {"expires": 20},
    },
    # Slurm-backed pools (scheduler.backends.slurm): states and nodes, association limits
    "slurm-sync": {"task": "scheduler.slurm_sync", "schedule": 5.0, "options": {"expires": 10}},
    "slurm-limits": {
        "task": "scheduler.slurm_limits",
        "schedule": 900.0,
        "options": {"expires": 900},
    },
}

from config.settings.billing import *  # noqa: E402,F403
from config.settings.monitoring import *  # noqa: E402,F403
from config.settings.storage import *  # noqa: E402,F403

CELERY_BEAT_SCHEDULE.update(BILLING_BEAT_SCHEDULE)  # noqa: F405
CELERY_BEAT_SCHEDULE.update(MONITORING_BEAT_SCHEDULE)  # noqa: F405
CELERY_BEAT_SCHEDULE.update(STORAGE_BEAT_SCHEDULE)  # noqa: F405

# Provisioning
AGENT_PORTAL_URL = env("AGENT_PORTAL_URL", default="http://127.0.0.1:8000")
PROVISIONING_SPAWN_AGENTS = env.bool("PROVISIONING_SPAWN_AGENTS", default=True)
CELERY_BEAT_SCHEDULE["autoscale"] = {
    "task": "provisioning.autoscale",
    "schedule": 15.0,
    "options": {"expires": 30},
}

# Pushed page updates (foundation/push.py, web/events.py): on wherever Redis is; PUSH_ENABLED=false
# turns them off (pages poll). A stream ends after PUSH_STREAM_MAX_S and the browser reconnects.
PUSH_ENABLED = env.bool("PUSH_ENABLED", default=True)
PUSH_STREAM_MAX_S = env.int("PUSH_STREAM_MAX_S", default=300)
