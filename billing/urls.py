"""Billing pages (mounted at /billing/)."""

from django.urls import path

app_name = "billing"
urlpatterns: list[object] = []
