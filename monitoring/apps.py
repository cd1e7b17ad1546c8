from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = "Monitoring"

    def ready(self) -> None:
        from monitoring import ingest, metrics
        from scheduler import ports

        ports.TELEMETRY_SINKS.register(ingest.ingest_samples)
        ports.ALLOCATION_LISTENERS.register(ingest.allocations_changed)
        ports.CYCLE_LISTENERS.register(metrics.cycle_ended)
