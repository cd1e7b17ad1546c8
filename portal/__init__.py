"""The portal: settings, Celery app, URL root, tenancy and the UI shell."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
