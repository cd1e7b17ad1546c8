# Allocations keep what they bill, frozen at placement (billing: a share is billed as placed).

from django.db import migrations, models

from scheduler.core.model import billed_share_milli, gpu_capacity_milli


def freeze_running(apps, schema_editor):
    """Running allocations keep what they bill from now on, read from their GPU as it is."""
    Allocation = apps.get_model("scheduler", "Allocation")
    rows = Allocation.objects.filter(ended_at__isnull=True, billed_milli__isnull=True)
    for alloc in rows.select_related("gpu").iterator():
        gpu = alloc.gpu
        alloc.billed_milli = billed_share_milli(
            alloc.share_milli,
            gpu_capacity_milli(gpu.sharing_mode, gpu.oversubscription),
            alloc.memory_mib,
            gpu.memory_mib,
        )
        alloc.save(update_fields=["billed_milli"])


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0010_quota_requests_and_member_cap"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="billed_milli",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="What the share bills (milli-GPU of one GPU), frozen at placement (scheduler.core.model.billed_share_milli); null on rows placed before it was kept.",
                null=True,
            ),
        ),
        migrations.RunPython(freeze_running, migrations.RunPython.noop, elidable=True),
    ]
