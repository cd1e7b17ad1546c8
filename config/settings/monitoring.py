"""Monitoring settings (owned by the monitoring app); imported at the end of base settings."""

import environ

_env = environ.Env()

# Redis keys of the live window and the raw samples start with this (tests isolate by it).
MONITORING_KEY_PREFIX = _env("MONITORING_KEY_PREFIX", default="mon")
MONITORING_LIVE_WINDOW_S = _env.int("MONITORING_LIVE_WINDOW_S", default=3600)
# Points kept per GPU: one hour at the agents' heartbeat period (5 s) by default.
MONITORING_LIVE_POINTS = _env.int("MONITORING_LIVE_POINTS", default=720)
# The cluster overview is computed once and shared by every operator for this long (seconds);
# the GPU/node list behind it is reused by a process for MONITORING_FLEET_CACHE_S.
MONITORING_OVERVIEW_CACHE_S = _env.float("MONITORING_OVERVIEW_CACHE_S", default=2.0)
MONITORING_FLEET_CACHE_S = _env.float("MONITORING_FLEET_CACHE_S", default=5.0)
MONITORING_LATEST_TTL_S = _env.int("MONITORING_LATEST_TTL_S", default=120)
MONITORING_FLUSH_GRACE_S = _env.int("MONITORING_FLUSH_GRACE_S", default=10)
MONITORING_MINUTE_RETENTION_DAYS = _env.int("MONITORING_MINUTE_RETENTION_DAYS", default=2)
MONITORING_HOUR_RETENTION_DAYS = _env.int("MONITORING_HOUR_RETENTION_DAYS", default=90)
MONITORING_SNAPSHOT_RETENTION_DAYS = _env.int("MONITORING_SNAPSHOT_RETENTION_DAYS", default=30)
MONITORING_ALERT_RETENTION_DAYS = _env.int("MONITORING_ALERT_RETENTION_DAYS", default=90)

# Alert rules
MONITORING_IDLE_UTIL_PCT = _env.float("MONITORING_IDLE_UTIL_PCT", default=5.0)
MONITORING_IDLE_MINUTES = _env.int("MONITORING_IDLE_MINUTES", default=30)
MONITORING_ALERT_TEMP_C = _env.float("MONITORING_ALERT_TEMP_C", default=85.0)
MONITORING_ALERT_XID_WINDOW_S = _env.int("MONITORING_ALERT_XID_WINDOW_S", default=600)
MONITORING_ALERT_QUEUE_WAIT_S = _env.int("MONITORING_ALERT_QUEUE_WAIT_S", default=3600)
MONITORING_ALERT_EMAIL = _env.bool("MONITORING_ALERT_EMAIL", default=True)

# /metrics: a bearer token (compared in constant time) or a client address in the allow-list.
METRICS_TOKEN = _env("METRICS_TOKEN", default="")
METRICS_ALLOWED_IPS = _env.list("METRICS_ALLOWED_IPS", default=[])

# Monitoring keeps the last cycle {"seconds", "at", "placed"} here (Django cache).
MONITORING_CYCLE_CACHE_KEY = "monitoring:scheduling-cycle"

MONITORING_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "telemetry-flush-rollups": {
        "task": "telemetry.flush_rollups",
        "schedule": 20.0,
        "options": {"expires": 40},
    },
    "telemetry-hour-rollups": {
        "task": "telemetry.hour_rollups",
        "schedule": 300.0,
        "options": {"expires": 280},
    },
    "telemetry-fleet-snapshot": {
        "task": "telemetry.fleet_snapshot",
        "schedule": 60.0,
        "options": {"expires": 50},
    },
    "telemetry-alerts": {
        "task": "telemetry.evaluate_alerts",
        "schedule": 30.0,
        "options": {"expires": 25},
    },
    "telemetry-retention": {
        "task": "telemetry.enforce_retention",
        "schedule": 3600.0,
        "options": {"expires": 1800},
    },
}
