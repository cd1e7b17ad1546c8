"""Jobs mount project volumes at container paths (issue 27): `volumes` and `checkpoint` replace
the host path `checkpoint_dir`; `working_dir` is a directory in the container. Old rows keep
their host paths in `legacy_host_paths` (shown, never sent to an agent), and lose them from
the columns an agent reads."""

from django.db import migrations, models


def keep_host_paths(apps, schema_editor):
    Job = apps.get_model("scheduler", "Job")
    old = Job.objects.exclude(checkpoint_dir="", working_dir="")
    for job in old.only("pk", "checkpoint_dir", "working_dir").iterator():
        paths = {k: v for k, v in (("checkpoint_dir", job.checkpoint_dir),
                                   ("working_dir", job.working_dir)) if v}
        Job.objects.filter(pk=job.pk).update(legacy_host_paths=paths, working_dir="")


def templates_without_host_paths(apps, schema_editor):
    """A template's body from before volumes would be refused (checkpoint_dir, a host
    working_dir): those keys are dropped, the rest of the request kept."""
    JobTemplate = apps.get_model("scheduler", "JobTemplate")
    for template in JobTemplate.objects.iterator():
        body = dict(template.body or {})
        if body.pop("checkpoint_dir", None) is not None or body.get("working_dir"):
            body.pop("working_dir", None)
            JobTemplate.objects.filter(pk=template.pk).update(body=body)


def restore_host_paths(apps, schema_editor):
    Job = apps.get_model("scheduler", "Job")
    for job in Job.objects.exclude(legacy_host_paths={}).iterator():
        Job.objects.filter(pk=job.pk).update(
            checkpoint_dir=job.legacy_host_paths.get("checkpoint_dir", ""),
            working_dir=job.legacy_host_paths.get("working_dir", ""),
        )


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0019_gangs_and_resize"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="volumes",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="job",
            name="checkpoint",
            field=models.CharField(blank=True, max_length=600),
        ),
        migrations.AddField(
            model_name="job",
            name="legacy_host_paths",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(keep_host_paths, restore_host_paths),
        migrations.RunPython(templates_without_host_paths, migrations.RunPython.noop),
        migrations.RemoveField(model_name="job", name="checkpoint_dir"),
        migrations.AlterField(
            model_name="job",
            name="working_dir",
            field=models.CharField(
                blank=True, help_text="In the container; blank: /workspace.", max_length=500
            ),
        ),
    ]
