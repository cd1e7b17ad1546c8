"""API error shape: every 4xx says what to fix; domain errors never become 500s.

Every error body of the API has one shape:

    {"code": "invalid", "message": "gpu_model: Unknown GPU model 'H999'.",
     "fields": {"gpu_model": ["Unknown GPU model 'H999'."]}, "detail": "..."}

`code` is stable for programs, `message` is one sentence for people, `fields` maps each input at
fault to its messages (empty when no field is at fault). `detail` (= `message`) and each field's
name at the top level are what this API answered before the envelope existed; they stay so that
existing clients keep working, unless a field's name is one of the envelope's own keys.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import OperationalError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.errors import DomainError

ENVELOPE_KEYS = frozenset({"code", "message", "fields", "detail"})

# PostgreSQL's answers when two transactions met and one was rolled back whole: a deadlock, a
# serialization failure, a lock that could not be had in time. Nothing was saved; the same
# request succeeds on a retry, so the client is told to retry (agents do, after Retry-After).
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001", "55P03"})
RETRY_AFTER_S = 1

log = logging.getLogger(__name__)


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one error shape (see the module's docstring)."""
    fields = fields or {}
    body: dict[str, Any] = {
        name: messages for name, messages in fields.items() if name not in ENVELOPE_KEYS
    }
    body.update(code=code, message=message, detail=message, fields=fields)
    return body


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        fields = {exc.field: [exc.message]} if exc.field else {}
        return Response(error_body(exc.code, exc.message, fields), status=exc.status)
    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "error_dict"):
            exc = exceptions.ValidationError(exc.message_dict)
        else:
            exc = exceptions.ValidationError({"non_field_errors": exc.messages})
    if isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found.")
    if isinstance(exc, OperationalError) and _sqlstate(exc) in TRANSIENT_SQLSTATES:
        log.warning("database conflict answered 503 (sqlstate %s): %s", _sqlstate(exc), exc)
        message = (
            "The request met a conflicting change in the database and nothing was saved; "
            f"retry in {RETRY_AFTER_S} s."
        )
        return Response(
            error_body("retry", message), status=503, headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    if isinstance(exc, exceptions.ValidationError):
        fields = _fields(exc.detail)
        response.data = error_body("invalid", _summary(fields), fields)
    else:
        code = exc.get_codes()
        response.data = error_body(
            code if isinstance(code, str) else exc.default_code, str(exc.detail)
        )
    return response


def _sqlstate(exc: OperationalError) -> str | None:
    """The SQLSTATE of the driver's error that Django wrapped (None off PostgreSQL)."""
    return getattr(exc.__cause__, "sqlstate", None)


def _fields(detail: Any) -> dict[str, Any]:
    if isinstance(detail, dict):
        return {str(name): _plain(messages) for name, messages in detail.items()}
    return {"non_field_errors": _plain(detail if isinstance(detail, list) else [detail])}


def _plain(value: Any) -> Any:
    """ErrorDetail strings, lists and dicts as plain JSON values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value)


def _first_message(value: Any) -> str:
    if isinstance(value, dict):
        for key, inner in value.items():
            text = _first_message(inner)
            if text:
                return f"{key}: {text}" if not str(key).isdigit() else text
        return ""
    if isinstance(value, list):
        return next((t for t in (_first_message(v) for v in value) if t), "")
    return str(value)


def _summary(fields: dict[str, Any]) -> str:
    """One sentence: the first field's first message, and how many other fields are at fault."""
    if not fields:
        return "The request is invalid."
    name, messages = next(iter(fields.items()))
    text = _first_message(messages) or "Invalid."
    first = text if name == "non_field_errors" else f"{name}: {text}"
    others = len(fields) - 1
    if others:
        first += f" (and {others} more field{'s' if others > 1 else ''})"
    return first
