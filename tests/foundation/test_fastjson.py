"""foundation.fastjson answers exactly what DRF's JSON parser and renderer answer: the same bytes,
the same data, the same error (type and message), over tables of inputs and generated ones."""

from __future__ import annotations

import datetime
import decimal
import enum
import io
import ipaddress
import math
import uuid
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy
from hypothesis import given, settings
from hypothesis import strategies as st
from rest_framework import parsers, renderers, serializers
from rest_framework.exceptions import ErrorDetail, ParseError
from rest_framework.utils.serializer_helpers import ReturnDict, ReturnList

from foundation import fastjson
from portal.api.schema import StrictJSONParser

UTC = datetime.UTC
SERIALIZER: serializers.Serializer[Any] = serializers.Serializer()
CET = datetime.timezone(datetime.timedelta(hours=1))


class Color(enum.Enum):
    RED = 1


class Size(enum.IntEnum):
    BIG = 3


class State(str, enum.Enum):  # noqa: UP042 (the str mixin is what is tested)
    RUNNING = "running"


@dataclass
class Point:
    x: int


Pair = namedtuple("Pair", "a b")


class PlainDict(dict[str, Any]):
    pass


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # the outcome compared is the exception's type and message
        return type(exc).__name__, str(exc)


def _generator() -> Any:
    return (i for i in range(3))


def _moved() -> OrderedDict[str, int]:
    d = OrderedDict(a=1, b=2)
    d.move_to_end("a")
    return d


RENDER_VALUES: list[Any] = [
    {},
    [],
    {"a": [1, 2, {"b": None, "c": True, "d": False}], "e": "x"},
    "plain",
    "unicode é ß 中文 😀",
    'controls \x00\x1f\x7f " \\ \n\t\b\f /',
    "separators \u2028 and \u2029",
    "lone \ud800 surrogate",
    {"\u2028key": "\u2029"},
    0,
    -1,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    10**40,
    0.0,
    -0.0,
    0.1,
    1.0,
    1e-4,
    9.99e-5,
    1e-5,
    1.5e-7,
    -3e-9,
    5e-324,
    123456.789,
    1e15,
    1e16,
    1.7976931348623157e308,
    float("nan"),
    float("inf"),
    -float("inf"),
    [1.0, float("nan")],
    datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    datetime.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=CET),
    datetime.datetime(2026, 1, 2, 3, 4, 5),
    datetime.datetime(2026, 1, 2, 3, 4, 5, 1),
    datetime.date(2026, 1, 2),
    datetime.time(3, 4, 5),
    datetime.time(3, 4, 5, 600),
    datetime.time(3, 4, 5, tzinfo=UTC),
    datetime.timedelta(days=1, seconds=3, microseconds=5),
    decimal.Decimal("1.50"),
    decimal.Decimal("0.00001"),
    decimal.Decimal("NaN"),
    decimal.Decimal("1E+400"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    gettext_lazy("Not found."),
    {"lazy": [gettext_lazy("Invalid input.")]},
    ipaddress.ip_address("10.0.0.1"),
    ipaddress.ip_network("10.0.0.0/8"),
    b"bytes",
    b"\xff not utf-8",
    (1, "two", None),
    Pair(1, 2),
    {1, 2},
    frozenset({"x"}),
    Color.RED,
    Size.BIG,
    State.RUNNING,
    Point(1),
    {1: "int key"},
    {None: "none key"},
    {(1, 2): "tuple key"},
    ReturnDict({"a": 1}, serializer=SERIALIZER),
    ReturnList([1, {"b": 2}], serializer=SERIALIZER),
    _moved(),
    OrderedDict(a=1),
    PlainDict(a=[1.5]),
    {"detail": ErrorDetail("Not found.", code="not_found")},
    [mark_safe("<b>safe</b>")],
    {"deep": [[[[[[[[[[{"x": 1}]]]]]]]]]]},
    object(),
]


@pytest.mark.parametrize("value", RENDER_VALUES, ids=lambda v: type(v).__name__)
def test_renderer_gives_drfs_bytes_or_error(value: Any) -> None:
    ours = _outcome(lambda: fastjson.JSONRenderer().render(value))
    drfs = _outcome(lambda: renderers.JSONRenderer().render(value))
    assert ours == drfs


def test_renderer_consumes_a_generator_once() -> None:
    assert fastjson.JSONRenderer().render({"g": _generator()}) == b'{"g":[0,1,2]}'


def test_renderer_none_is_empty() -> None:
    assert fastjson.JSONRenderer().render(None) == renderers.JSONRenderer().render(None) == b""


@pytest.mark.parametrize(
    ("media_type", "context"),
    [
        ("application/json; indent=2", {}),
        ("application/json; indent=4", {}),
        ("application/json; indent=0", {}),
        ("application/json; indent=x", {}),
        ("application/json; indent=20", {}),
        (None, {"indent": 4}),
        ("application/json", {"indent": 2}),
        ("application/json", {}),
    ],
)
def test_renderer_indents_as_drf(media_type: str | None, context: dict[str, Any]) -> None:
    value = {"a": [1, {"b": datetime.date(2026, 1, 2)}], "c": "é"}
    ours = fastjson.JSONRenderer().render(value, media_type, context)
    assert ours == renderers.JSONRenderer().render(value, media_type, context)


@pytest.mark.parametrize(
    "changed", [{"ensure_ascii": True}, {"strict": False}, {"compact": False}], ids=str
)
def test_renderer_honours_settings_that_change_the_output(changed: dict[str, bool]) -> None:
    ours = type("Ours", (fastjson.JSONRenderer,), changed)
    drfs = type("Drfs", (renderers.JSONRenderer,), changed)
    for value in ({"é": [1.5, None]}, [float("nan")]):
        assert _outcome(lambda v=value: ours().render(v)) == _outcome(
            lambda v=value: drfs().render(v)
        )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.datetimes(timezones=st.none() | st.just(UTC))
    | st.dates()
    | st.decimals()
    | st.uuids(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        | st.tuples(inner, inner)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_renderer_matches_drf_on_generated_values(value: Any) -> None:
    ours = _outcome(lambda: fastjson.JSONRenderer().render(value))
    drfs = _outcome(lambda: renderers.JSONRenderer().render(value))
    assert ours == drfs


@settings(max_examples=400, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: abs(x) >= 1e-4 or x == 0))
def test_orjson_writes_floats_from_1e4_up_as_repr(value: float) -> None:
    # The renderer's fast path rests on this: orjson writes such floats as Python's repr.
    assert fastjson.JSONRenderer().render([value]) == f"[{value!r}]".encode()


PARSE_BODIES: list[bytes] = [
    b"{}",
    b"[]",
    b' {"a": [1, 2.5, -3e2, true, false, null], "b": "x"} ',
    b'"string"',
    b"42",
    b"-0",
    b"-0.0",
    b"1E5",
    b"1e-400",
    b"1e400",
    b"-1e400",
    b"0.1000000000000000055511151231257827021181583404541015625",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"123456789012345678901234567890",
    b'{"n": 1234567890123456789012345678901234567890}',
    b'{"s": "1234567890123456789012"}',
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b'{"x": NaN}',
    b'{"a": 1, "b": 2, "a": 3}',
    b'"\\u00e9\\u4e2d\\ud83d\\ude00"',
    b'"\\ud800"',
    b'"\\udc00\\ud800"',
    b'{"\\ud800": 1}',
    b'"\\u2028"',
    '"é 中 😀"'.encode(),
    b'"\xff"',
    b'"\xed\xa0\x80"',
    b'"\xc0\xaf"',
    b'"\xf0\x9f\x98"',
    b"\xef\xbb\xbf{}",
    b"",
    b"   ",
    b"{",
    b"{not json",
    b'{"a":1,}',
    b"[1,]",
    b"01",
    b".5",
    b"+1",
    b"1.",
    b'"\x01"',
    b'"\x7f"',
    b'"\\x"',
    b"\x0c{}",
    b"{} x",
    b'{"a":1}\x00',
    b"[" * 100 + b"]" * 100,
    b"[" * 600 + b"]" * 600,
    b"[" * 1000 + b"]" * 1000,
    b"[" * 2000 + b"]" * 2000,
    b"[" + b"[1]," * 600 + b"[1]]",
]


def _parse(parser: parsers.BaseParser, body: bytes, encoding: str | None = None) -> Any:
    context = {} if encoding is None else {"encoding": encoding}
    return parser.parse(io.BytesIO(body), "application/json", context)


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    """Equal outcomes; NaN equal to NaN, and types compared (1 is not 1.0)."""
    return repr(a) == repr(b)


@pytest.mark.parametrize("body", PARSE_BODIES, ids=lambda b: repr(b[:24]))
def test_parser_gives_drfs_data_or_error(body: bytes) -> None:
    ours = _outcome(lambda: _parse(fastjson.JSONParser(), body))
    drfs = _outcome(lambda: _parse(parsers.JSONParser(), body))
    assert _same(ours, drfs)


@pytest.mark.parametrize("encoding", ["utf-8", "UTF8", "utf-16", "latin-1", "bz2_codec", "nope"])
def test_parser_honours_the_charset_as_drf(encoding: str) -> None:
    for body in ('{"a": "é"}'.encode(encoding if encoding[0] in "ul" else "utf-8"), b"[1]"):
        ours = _outcome(lambda b=body: _parse(fastjson.JSONParser(), b, encoding))
        drfs = _outcome(lambda b=body: _parse(parsers.JSONParser(), b, encoding))
        assert _same(ours, drfs)


def test_parser_errors_are_drfs_parse_errors() -> None:
    with pytest.raises(ParseError, match="JSON parse error - Out of range float values"):
        _parse(fastjson.JSONParser(), b'{"x": NaN}')


def test_strict_parser_still_refuses_unpaired_surrogates() -> None:
    with pytest.raises(ParseError, match="Unicode text"):
        _parse(StrictJSONParser(), b'{"a": ["\\udc00"]}')
    assert _parse(StrictJSONParser(), b'"\\ud83d\\ude00"') == "😀"
    assert _parse(StrictJSONParser(), b'{"n": 123456789012345678901234567890}') == {
        "n": 123456789012345678901234567890
    }


@settings(max_examples=400, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_parser_matches_drf_on_generated_documents(value: Any) -> None:
    import json

    body = json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")
    ours = _outcome(lambda: _parse(fastjson.JSONParser(), body))
    drfs = _outcome(lambda: _parse(parsers.JSONParser(), body))
    assert _same(ours, drfs)
    if ours[0] == "ok" and not any(
        isinstance(x, float) and math.isnan(x) for x in _leaves(ours[1])
    ):
        assert ours == drfs


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


@pytest.mark.django_db
def test_api_round_trip_goes_through_the_orjson_classes(make_user: Any, api: Any) -> None:
    client = api(make_user())
    resp = client.generic(
        "POST", "/api/v1/tokens/", '{"name": "é token"}', content_type="application/json"
    )
    assert resp.status_code == 201, resp.content
    assert resp["Content-Type"] == "application/json"
    body = resp.content
    assert "é token".encode() in body  # UTF-8, not \\u escapes
    assert b": " not in body and b", " not in body  # compact
    data = resp.json()
    assert data["name"] == "é token"
    assert renderers.JSONRenderer().render(data) == body
    listed = client.get("/api/v1/tokens/")
    assert listed.status_code == 200
    assert renderers.JSONRenderer().render(listed.json()) == listed.content
    bad = client.generic("POST", "/api/v1/tokens/", "{not json", content_type="application/json")
    assert bad.status_code == 400
    assert "JSON parse error" in bad.json()["detail"]
    pretty = client.get("/api/v1/tokens/", HTTP_ACCEPT="application/json; indent=4")
    assert pretty.content.startswith(b"{\n    ")
    browsable = client.get("/api/v1/tokens/?format=api", HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200
    assert browsable["Content-Type"].startswith("text/html")


def test_the_common_requests_take_the_orjson_path() -> None:
    """The point of the module: agents' heartbeats and job answers do not fall back to DRF."""
    from bench.agent_requests import heartbeat_body
    from bench.json_cost import job_answer

    uuids = [f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(8)]
    heartbeat = renderers.JSONRenderer().render(heartbeat_body(uuids, samples_per_gpu=10))
    data, by_orjson = StrictJSONParser().parse_bytes(heartbeat, "application/json", {})
    assert by_orjson
    assert data == heartbeat_body(uuids, samples_per_gpu=10)
    big = renderers.JSONRenderer().render(heartbeat_body(uuids * 8, samples_per_gpu=8))
    assert StrictJSONParser().parse_bytes(big, "application/json", {})[1]  # 512 samples
    answer = ReturnDict(job_answer(1), serializer=SERIALIZER)
    assert fastjson._plain(answer)
    assert fastjson._plain({"results": ReturnList([answer], serializer=SERIALIZER), "next": None})
    assert fastjson.JSONRenderer().render(answer) == renderers.JSONRenderer().render(answer)
