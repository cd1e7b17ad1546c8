"""The one error type services raise; views and the API turn it into a 4xx with its message."""


class DomainError(Exception):
    """A request the domain refuses. `code` is stable for clients; `field` names the input at fault."""

    status = 400

    def __init__(self, message: str, *, code: str = "invalid", field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field


class NotFound(DomainError):
    status = 404

    def __init__(self, message: str = "Not found.") -> None:
        super().__init__(message, code="not_found")


class PermissionDenied(DomainError):
    status = 403

    def __init__(self, message: str = "You do not have permission to do this.") -> None:
        super().__init__(message, code="permission_denied")


class Conflict(DomainError):
    status = 409

    def __init__(self, message: str, *, code: str = "conflict") -> None:
        super().__init__(message, code=code)
