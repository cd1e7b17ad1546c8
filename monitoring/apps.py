from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class MonitoringConfig(AppConfig):
    name = "monitoring"
    verbose_name = "Monitoring"

    def ready(self) -> None:
        from monitoring.ingest import on_allocation_saved
        from scheduler.models import Allocation

        post_save.connect(on_allocation_saved, sender=Allocation, dispatch_uid="mon-alloc-save")
        post_delete.connect(on_allocation_saved, sender=Allocation, dispatch_uid="mon-alloc-del")
