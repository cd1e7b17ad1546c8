"""Every model of ours is in the operators' admin (directly or as an inline)."""

from __future__ import annotations

from django.apps import apps
from django.contrib import admin


def test_every_model_is_registered():
    inlines = {
        inline.model
        for model_admin in admin.site._registry.values()
        for inline in model_admin.inlines
    }
    missing = [
        model._meta.label
        for app in ("portal", "scheduler", "billing", "monitoring")
        for model in apps.get_app_config(app).get_models()
        if model not in admin.site._registry and model not in inlines
    ]
    assert missing == []
