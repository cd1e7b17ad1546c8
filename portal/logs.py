"""Structured logs: one JSON object a line, each carrying the request id it was written for.

`RequestIdMiddleware` takes the load balancer's `X-Request-ID` when it is a sane token (else
makes one), keeps it for the request's duration, and answers with it, so one id follows a
request from the balancer through every log line to the client. `LOG_FORMAT=json` (the
default in production) turns the JSON lines on; plain text stays the default elsewhere.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from django.http import HttpRequest, HttpResponse

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_SANE = re.compile(r"[A-Za-z0-9._-]{8,128}")


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get("X-Request-ID", "")
        rid = given if _SANE.fullmatch(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        try:
            response = self.get_response(request)
        finally:
            request_id.reset(token)
        response["X-Request-ID"] = rid
        return response


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (None outside a request: tasks, commands)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, request_id, and the exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
