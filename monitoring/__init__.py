"""Telemetry ingest, live series, rollups, Prometheus exposition, alerts, efficiency."""
