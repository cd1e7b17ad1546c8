"""Quotas and their per-model limits now belong to the scheduler (its 0006 takes them over).

State only: the tables stay where they are, under their old names, with every row.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0002_audit_append_only"),
        ("scheduler", "0006_quotas_from_portal"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="quotamodellimit", name="quota_model_limit_unique"),
                migrations.DeleteModel(name="QuotaModelLimit"),
                migrations.DeleteModel(name="Quota"),
            ],
            database_operations=[],
        ),
    ]
