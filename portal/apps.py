from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Tenancy"

    def ready(self) -> None:
        from portal import auth_events  # noqa: F401  (connects the signal receivers)
