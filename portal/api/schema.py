"""OpenAPI schema that tells the whole truth: error responses, strict bodies, strict paging.

- `PortalAutoSchema` documents the 4xx answers every endpoint can give (the shape of
  `portal/api/errors.py`), so clients and contract tests know them.
- `StrictSerializerExtension` marks bodies of `StrictSerializer`s `additionalProperties: false`:
  the server refuses unknown fields, so the schema says so.
- `StrictJSONParser` refuses JSON strings that are not Unicode text (unpaired surrogates); it
  reads JSON as `foundation.fastjson.JSONParser` does.
- `StrictLimitOffsetPagination` answers 400 for a `limit`/`offset` that is not a whole number
  instead of silently ignoring it, and documents their ranges.
"""

from __future__ import annotations

import codecs
from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.openapi import AutoSchema
from rest_framework import pagination, serializers
from rest_framework.exceptions import ParseError

from foundation.fastjson import JSONParser
from foundation.params import whole_number

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every error has this shape: `code` for programs, `message` for people, "
    "`fields` maps each input at fault to its messages. `detail` repeats `message`, and each "
    "field's name also appears at the top level (the shape before `fields` existed).",
    "properties": {
        "code": {"type": "string"},
        "message": {"type": "string"},
        "fields": {"type": "object", "additionalProperties": True},
        "detail": {"type": "string"},
    },
    "required": ["code", "message", "fields"],
    "additionalProperties": True,
}
ERRORS = {
    "400": "The request is invalid; the body names the field at fault.",
    "401": "No valid credentials (send `Authorization: Bearer <token>`).",
    "403": "Authenticated, but the role or account may not do this.",
    "404": "No such object, or one you may not see.",
    "405": "The method is not allowed on this path.",
    "409": "The request conflicts with the object's current state.",
    "429": "Too many requests; retry later.",
}


IDEMPOTENCY_KEY_PARAMETER: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A unique string per operation (a UUID). A retry with the same key, body and "
    "path gets the first successful answer again (header `Idempotent-Replayed: true`) and runs "
    "nothing; the same key with another request is a 422. Keys are kept 24 hours.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
}


PUBLIC_TAG = "Portal API"
AGENT_TAG = "Node agents (internal)"


class PortalAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema plus the documented error answers of every operation, and
    the `Idempotency-Key` header on the POSTs of views that honour it."""

    def get_tags(self) -> list[str]:
        """Two groups, the public API first (SPECTACULAR_SETTINGS["TAGS"] orders them): the node
        agents' endpoints are for agents, not for the people reading the docs."""
        if self.path.startswith("/api/agent/"):
            return [AGENT_TAG]
        return [PUBLIC_TAG]

    def _idempotent(self) -> bool:
        from portal.api.idempotency import IdempotentPostMixin

        return self.method == "POST" and isinstance(self.view, IdempotentPostMixin)

    def _get_parameters(self) -> list[dict[str, Any]]:
        params: list[dict[str, Any]] = super()._get_parameters()
        if self._idempotent():
            params.append(dict(IDEMPOTENCY_KEY_PARAMETER))
        return params

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:  # type: ignore[override]
        responses: dict[str, Any] = super()._get_response_bodies(direction)  # type: ignore[arg-type]
        for code, description in ERRORS.items():
            content: dict[str, Any] = {"application/json": {"schema": ERROR_SCHEMA}}
            if code == "404":
                # A path that matches no route at all gets Django's HTML "Not Found" page.
                content["text/html"] = {"schema": {"type": "string"}}
            responses.setdefault(code, {"description": description, "content": content})
        if self._idempotent():
            responses.setdefault(
                "422",
                {
                    "description": "The Idempotency-Key was already used for another request.",
                    "content": {"application/json": {"schema": ERROR_SCHEMA}},
                },
            )
        return responses


class StrictSerializerExtension(OpenApiSerializerExtension):  # type: ignore[no-untyped-call]
    target_class = "portal.api.serializers.StrictSerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema: AutoSchema, direction: str) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer(  # type: ignore[attr-defined]
            self.target, direction, bypass_extensions=True
        )
        schema["additionalProperties"] = False
        for prop in schema.get("properties", {}).values():
            _no_nul(prop)
        return schema


NUL_FREE = "^[^\\x00]*$"


def _no_nul(prop: dict[str, Any]) -> None:
    """DRF's CharField refuses NUL characters (PostgreSQL cannot store them): say so."""
    if prop.get("type") == "string" and not {"format", "enum", "pattern"} & set(prop):
        prop["pattern"] = NUL_FREE
    for key in ("items", "additionalProperties"):
        if isinstance(prop.get(key), dict):
            _no_nul(prop[key])


class StrictLimitOffsetPagination(pagination.LimitOffsetPagination):
    max_limit = 1000

    def get_limit(self, request: Any) -> int | None:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        value = whole_number(raw, maximum=self.max_limit or 1000)
        if value is None or value < 1:
            raise serializers.ValidationError(
                {self.limit_query_param: [f"A whole number from 1 to {self.max_limit}."]}
            )
        return value

    def get_offset(self, request: Any) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        value = whole_number(raw, maximum=2**31)
        if value is None:
            raise serializers.ValidationError(
                {self.offset_query_param: [f"A whole number from 0 to {2**31}."]}
            )
        return value

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        for param in params:
            if param["name"] == self.limit_query_param:
                param["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_limit}
            elif param["name"] == self.offset_query_param:
                param["schema"] = {"type": "integer", "minimum": 0, "maximum": 2**31}
        return params


class StrictJSONParser(JSONParser):
    """JSON whose strings PostgreSQL can store: an unpaired surrogate (`"\\ud800"`) is valid
    JSON syntax but not Unicode text, so it is a 400 here rather than an error deep in a write."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read()
        data, unicode_text = self.parse_bytes(raw, media_type, parser_context)
        if unicode_text:
            return data  # orjson read it, and it refuses unpaired surrogates
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        # UTF-8 cannot encode a surrogate, so in UTF-8 one comes only from a \u escape: without
        # one, the walk is skipped.
        if codecs.lookup(encoding).name == "utf-8" and b"\\u" not in raw:
            return data
        if _has_surrogate(data):
            raise ParseError("JSON strings must be Unicode text (no unpaired surrogates).")
        return data


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False
