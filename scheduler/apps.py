from django.apps import AppConfig
from django.core import checks
from django.db.models.signals import post_save


class SchedulerConfig(AppConfig):
    name = "scheduler"
    verbose_name = "GPUs and scheduling"

    def ready(self) -> None:
        from portal.models import Project
        from scheduler.ports import check_required_ports
        from scheduler.quotas import create_quota_for_new_project

        post_save.connect(
            create_quota_for_new_project, sender=Project, dispatch_uid="scheduler.project-quota"
        )
        checks.register(check_required_ports)

        from scheduler.volume_use import volumes_in_use
        from storage.ports import VOLUME_IN_USE

        VOLUME_IN_USE.register(volumes_in_use)  # a volume an unended job mounts stays

        from scheduler.backends.slurm import signals

        signals.connect()  # quota edits → Slurm account limits
