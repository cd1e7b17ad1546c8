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

        from scheduler.backends.slurm import signals

        signals.connect()  # quota edits → Slurm account limits
