"""Quotas and their per-model limits move from portal to the scheduler, which admits against them.

State only: the tables keep their names (`portal_quota`, `portal_quotamodellimit`) and no row
moves. The content types are relabelled so that admin permissions and log entries follow.
"""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

MOVED = ("quota", "quotamodellimit")


def relabel(from_label, to_label):
    def run(apps, schema_editor):
        ContentType = apps.get_model("contenttypes", "ContentType")
        db = schema_editor.connection.alias
        for model in MOVED:
            if not ContentType.objects.using(db).filter(app_label=to_label, model=model).exists():
                ContentType.objects.using(db).filter(app_label=from_label, model=model).update(
                    app_label=to_label
                )

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("portal", "0002_audit_append_only"),
        ("scheduler", "0005_job_time_limit_image_digest"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Quota",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("max_gpus", models.PositiveIntegerField(blank=True, help_text="Concurrent GPUs across all models (blank: unlimited).", null=True)),
                        ("gpu_hours_per_month", models.PositiveIntegerField(blank=True, help_text="GPU-hours per calendar month (blank: unlimited).", null=True)),
                        ("max_gpus_per_job", models.PositiveIntegerField(default=8, validators=[django.core.validators.MinValueValidator(1), django.core.validators.MaxValueValidator(4096)])),
                        ("max_priority", models.PositiveSmallIntegerField(choices=[(0, "Low"), (1, "Normal"), (2, "High"), (3, "Urgent")], default=1)),
                        ("allow_borrowing", models.BooleanField(default=True, help_text="Over-quota work may run as preemptible when GPUs are idle.")),
                        ("updated_at", models.DateTimeField(auto_now=True)),
                        ("project", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name="quota", to="portal.project")),
                    ],
                    options={"db_table": "portal_quota"},
                ),
                migrations.CreateModel(
                    name="QuotaModelLimit",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("max_gpus", models.PositiveIntegerField()),
                        ("gpu_model", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="scheduler.gpumodel")),
                        ("quota", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="model_limits", to="scheduler.quota")),
                    ],
                    options={"db_table": "portal_quotamodellimit"},
                ),
                migrations.AddConstraint(
                    model_name="quotamodellimit",
                    constraint=models.UniqueConstraint(fields=("quota", "gpu_model"), name="quota_model_limit_unique", violation_error_message="This GPU model already has a limit in this quota."),
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(relabel("portal", "scheduler"), relabel("scheduler", "portal")),
    ]
