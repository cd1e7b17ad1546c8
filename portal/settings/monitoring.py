"""Monitoring settings (owned by the monitoring app); imported at the end of base settings."""

MONITORING_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
