from rest_framework.routers import SimpleRouter


class OptionalSlashRouter(SimpleRouter):
    """Routes that answer with or without the trailing slash (`POST /api/v1/jobs` works)."""

    def __init__(self) -> None:
        super().__init__()
        self.trailing_slash = "/?"
