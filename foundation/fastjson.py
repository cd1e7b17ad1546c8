"""The API's JSON parser and renderer: orjson where it answers exactly what DRF's own would.

DRF parses and renders JSON with the standard library's `json` module, a few percent of the web
workers' CPU (heartbeats' telemetry in, job answers out). orjson does the same work several times
faster, but not always to the same result, so each class here takes orjson's answer only where
it is provably DRF's, and otherwise hands the input to DRF's class, which then answers (or fails)
exactly as before. tests/foundation/test_fastjson.py holds them to DRF's classes over tables of inputs.

Fast path, justified by `bench.json_cost` (docs/benchmarks.md: DRF's classes 2.0x to 3.3x the
CPU of these on heartbeats, job answers and pages).

Where orjson and `json` differ, and what is done about it:

- Parsing: orjson reads an integer beyond 64 bits as a float (`json` as an int), so a body with
  19 digits in a row goes to DRF. Everything orjson refuses (NaN and Infinity, which DRF refuses
  too in strict mode; numbers that overflow to infinity, which `json` accepts; unpaired
  surrogate escapes; invalid UTF-8; a BOM; any syntax error) goes to DRF, so error messages are
  DRF's. orjson nests up to 1024 levels while `json` fails with RecursionError somewhat below
  1000 (depending on the stack), so a body that may nest deeply goes to DRF as well.
- Rendering: orjson writes NaN and infinities as `null` (DRF's strict mode raises) and floats
  below 1e-4 without an exponent (`0.00001` where `json` writes `1e-05`); it renders Enum
  members, dataclasses and OrderedDicts in its own way; `default` may consume a generator
  before a failure. So the data is first checked to hold only types whose rendering is known
  to be identical (the check costs a fraction of what orjson saves), and anything else goes to
  DRF. Datetimes, dates, times, Decimals and lazy strings go through DRF's encoder's `default`,
  so they keep DRF's format ("Z", milliseconds as Python writes them). An indent (asked in the
  media type, or by the browsable API) and non-default UNICODE_JSON, COMPACT_JSON or STRICT_JSON
  settings go to DRF too. U+2028 and U+2029 are escaped as DRF does.
"""

from __future__ import annotations

import codecs
import datetime
import decimal
import enum
import io
import ipaddress
import math
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
from django.conf import settings
from django.utils.functional import Promise
from rest_framework import parsers, renderers
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

_SCALARS = frozenset({str, int, bool, type(None)})
_DICTS = frozenset({dict, ReturnDict})
_ARRAYS = frozenset({list, tuple, ReturnList})
# Rendered by DRF's encoder's `default` (orjson passes datetimes through to it, and knows none of
# the others), each to a string or, for a Decimal, a float that is checked like any other.
_VIA_DEFAULT = frozenset(
    {
        datetime.datetime,
        datetime.date,
        datetime.time,
        datetime.timedelta,
        decimal.Decimal,
        ipaddress.IPv4Address,
        ipaddress.IPv6Address,
        ipaddress.IPv4Network,
        ipaddress.IPv6Network,
        ipaddress.IPv4Interface,
        ipaddress.IPv6Interface,
    }
)
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _float_as_json(value: float) -> bool:
    """orjson writes this float as `repr` does (`json`'s way): finite, and zero or at least 1e-4
    in size (smaller ones it writes without an exponent). NaN fails both comparisons."""
    return value == 0.0 or 1e-4 <= abs(value) < math.inf


def _plain(value: Any) -> bool:
    """Whether orjson renders `value` exactly as DRF's renderer does (see the module's notes)."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is float:
        return _float_as_json(value)
    if kind in _DICTS:
        items = value.values()
    elif kind in _ARRAYS:
        items = value
    else:
        return _plain_other(value, kind)
    for item in items:  # noqa: SIM110 (a loop is faster than all() over a generator)
        if type(item) not in _SCALARS and not _plain(item):
            return False
    return True


def _plain_other(value: Any, kind: type) -> bool:
    if kind in _VIA_DEFAULT or kind is uuid.UUID or isinstance(value, Promise):
        return True  # uuid: orjson writes str(value), as DRF's `default` does
    if isinstance(value, enum.Enum):
        # `json` writes the str or int the member is; orjson writes its value.
        base = str if isinstance(value, str) else int if isinstance(value, int) else None
        return base is not None and type(value.value) is base and value.value == value
    if isinstance(value, (str, int)):
        return True  # both write the text or number itself
    if isinstance(value, dict):
        # `json` iterates items(), orjson the dict itself: the same unless items() differs
        # (an OrderedDict keeps its own order).
        return type(value).items is dict.items and all(_plain(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return False  # floats' subclasses, generators, QuerySets, sets, dataclasses, ...: DRF's


class _NotPlain(TypeError):
    """Raised in orjson's `default` so that orjson fails and DRF renders instead."""


class JSONRenderer(renderers.JSONRenderer):
    """DRF's JSONRenderer, through orjson where that gives the same bytes."""

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        if data is None or self.ensure_ascii or not self.compact or not self.strict:
            return super().render(data, accepted_media_type, renderer_context)
        # DRF's get_indent reads an `indent` parameter of the media type, else the context's.
        if accepted_media_type and ";" in accepted_media_type:
            indent = self.get_indent(accepted_media_type, renderer_context or {})
        else:
            indent = (renderer_context or {}).get("indent")
        if indent is not None:
            return super().render(data, accepted_media_type, renderer_context)
        try:
            plain = _plain(data)
        except RecursionError:
            plain = False
        if not plain:
            return super().render(data, accepted_media_type, renderer_context)
        encoder_default = self.encoder_class().default

        def default(obj: Any) -> Any:
            result = encoder_default(obj)
            if not _plain(result):
                raise _NotPlain
            return result

        try:
            ret = orjson.dumps(data, default=default, option=_OPTIONS)
        except orjson.JSONEncodeError:  # ints beyond 64 bits, keys that are not str, ...
            return super().render(data, accepted_media_type, renderer_context)
        # DRF escapes these two so that the JSON is also JavaScript (see its renderer).
        if not ret.isascii() and (b"\xe2\x80\xa8" in ret or b"\xe2\x80\xa9" in ret):
            ret = ret.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
        return ret


# The body with every digit made "0", every "[" and "{" made "[", and all else a space: two C
# passes over it (this and a search) answer both questions below, where a regular expression
# would cost more than orjson saves.
_MARKS = bytes(
    ord("0") if chr(c).isdigit() and c < 128 else ord("[") if c in b"[{" else ord(" ")
    for c in range(256)
)
# 19 digits in a row may be an integer beyond 64 bits, which orjson would read as a float.
_LONG_NUMBER = b"0" * 19
# A document with fewer brackets than this cannot nest deep enough for `json` to fail (its
# recursion limit, less the stack already in use) where orjson succeeds; one with more is
# checked after parsing.
_DEEP = 500


def _depth(value: Any) -> int:
    if type(value) is dict:
        return 1 + max(map(_depth, value.values()), default=0)
    if type(value) is list:
        return 1 + max(map(_depth, value), default=0)
    return 0


def _shallow(data: Any) -> bool:
    try:
        return _depth(data) < _DEEP
    except RecursionError:
        return False


class JSONParser(parsers.JSONParser):
    """DRF's JSONParser, through orjson where that gives the same data; DRF's otherwise, with
    DRF's messages."""

    renderer_class = JSONRenderer

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return self.parse_bytes(stream.read(), media_type, parser_context)[0]

    def parse_bytes(
        self, raw: bytes, media_type: str | None = None, parser_context: Any = None
    ) -> tuple[Any, bool]:
        """The data, and whether orjson read it (then every string in it is Unicode text:
        orjson refuses invalid UTF-8 and unpaired surrogate escapes)."""
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            utf8 = codecs.lookup(encoding).name == "utf-8"
        except (LookupError, TypeError):
            utf8 = False
        if utf8:
            marks = raw.translate(_MARKS)
            if _LONG_NUMBER not in marks:
                try:
                    data = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    pass
                else:
                    if len(raw) < 2 * _DEEP or marks.count(b"[") < _DEEP or _shallow(data):
                        return data, True
        return super().parse(io.BytesIO(raw), media_type, parser_context), False
