"""Fast path: a plain parser for a flat serializer's common requests, beside the serializer.

Justified by `bench.fast_paths` (a submission parsed 17x as fast as by the serializer),
`bench.submit_cost` and `bench.submit_throughput` (docs/benchmarks.md, "Jobs from
API submit to running"): validating a job submission through DRF (a serializer and its fields
per request, each value through `run_validation`, its validators and their messages) was a
tenth of the submit path's CPU. `PlainParser(serializer_class)` reads the serializer's own
declared fields once (their limits, defaults, choices), so the two cannot drift apart, and
answers exactly the `validated_data` that serializer would for a request whose every value is
plainly valid: strings that are ASCII, not blank unless allowed, already trimmed and within
their lengths; ints (not bools, not strings) within their bounds; bools; a choice's own
string; lists of choices; dicts of such strings; null where allowed. For anything else,
including every invalid request, it answers None and the serializer parses the request and
explains what is wrong, with its usual messages. The property tests in
tests/scheduler/test_submit_parse.py hold it to the serializer.

Fields of other kinds make the parser answer None whenever the request carries them, unless
the caller passes a `resolver` for that field: a function from the raw value to the value
the field would validate it to, or `UNRESOLVED` where the serializer must decide.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.core.validators import RegexValidator
from rest_framework import fields, serializers

UNRESOLVED = object()
_NO = object()  # a value the plan's check does not pass


def _text_check(field: fields.CharField) -> Callable[[Any], Any]:
    low, high = field.min_length or 0, field.max_length
    blank, trim = field.allow_blank, field.trim_whitespace

    def check(value: Any) -> Any:
        if (
            type(value) is str
            and value.isascii()  # no surrogates; strip() trims the ASCII whitespace only
            and "\x00" not in value
            and (value != "" or blank)
            and (not trim or value == value.strip())
            and (value == "" or low <= len(value))
            and (high is None or len(value) <= high)
        ):
            return value
        return _NO

    return check


def _slug_check(field: fields.SlugField) -> Callable[[Any], Any]:
    text = _text_check(field)
    (pattern,) = [re.compile(v.regex) for v in field.validators if isinstance(v, RegexValidator)]

    def check(value: Any) -> Any:
        value = text(value)
        if value is _NO or value == "" or not pattern.search(value):
            return _NO
        return value

    return check


def _int_check(field: fields.IntegerField) -> Callable[[Any], Any]:
    low, high = field.min_value, field.max_value

    def check(value: Any) -> Any:
        if type(value) is int and (low is None or value >= low) and (high is None or value <= high):
            return value
        return _NO

    return check


def _bool_check(value: Any) -> Any:
    return value if type(value) is bool else _NO


def _choice_check(field: fields.ChoiceField) -> Callable[[Any], Any]:
    choices = dict(field.choice_strings_to_values)

    def check(value: Any) -> Any:
        if type(value) is str and value != "":
            return choices.get(value, _NO)
        return _NO

    return check


def _list_check(field: fields.ListField, item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    low, high, allow_empty = field.min_length or 0, field.max_length, field.allow_empty

    def check(value: Any) -> Any:
        if type(value) is not list or not (allow_empty or value):
            return _NO
        if len(value) < low or (high is not None and len(value) > high):
            return _NO
        out = [item(v) for v in value]
        return _NO if _NO in out else out

    return check


def _dict_check(field: fields.DictField, item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    allow_empty = field.allow_empty

    def check(value: Any) -> Any:
        if type(value) is not dict or not (allow_empty or value):
            return _NO
        out = {}
        for key, v in value.items():
            if type(key) is not str:
                return _NO
            parsed = item(v)
            if parsed is _NO:
                return _NO
            out[key] = parsed
        return out

    return check


def _standard_validators_only(field: fields.Field) -> bool:  # type: ignore[type-arg]
    """The field carries only the validators its own arguments add (no `validators=`)."""
    return "validators" not in getattr(field, "_kwargs", {"validators": None})


def _plain_check(field: fields.Field) -> Callable[[Any], Any] | None:  # type: ignore[type-arg]
    """A check for a field's raw value (its validated value, or `_NO`), or None for a field
    this parser does not read."""
    if not _standard_validators_only(field):
        return None
    kind = type(field)
    if kind is fields.CharField:
        return _text_check(field)  # type: ignore[arg-type]
    if kind is fields.SlugField:
        if field.allow_unicode:  # type: ignore[attr-defined]
            return None
        return _slug_check(field)  # type: ignore[arg-type]
    if kind is fields.IntegerField:
        return _int_check(field)  # type: ignore[arg-type]
    if kind is fields.BooleanField:
        return _bool_check
    if kind is fields.ChoiceField:
        return _choice_check(field)  # type: ignore[arg-type]
    if kind in (fields.ListField, fields.DictField):
        child = field.child  # type: ignore[attr-defined]
        item = (
            None
            if type(child) not in (fields.CharField, fields.ChoiceField)
            else _plain_check(child)
        )
        if item is None or child.allow_null:
            return None
        if kind is fields.ListField:
            return _list_check(field, item)  # type: ignore[arg-type]
        return _dict_check(field, item)  # type: ignore[arg-type]
    return None


class _Plan:
    def __init__(self, name: str, field: fields.Field, check: Callable[[Any], Any] | None) -> None:  # type: ignore[type-arg]
        self.name = name
        self.check = check  # None: the serializer decides whenever the request carries it
        self.required = field.required
        self.allow_null = field.allow_null
        self.default = field.default

    def missing(self) -> Any:
        """What the field validates to when the request leaves it out (`UNRESOLVED`: the
        field is required; `_NO`: it is left out of the validated data)."""
        if self.required:
            return UNRESOLVED
        if self.default is fields.empty:
            return _NO
        if callable(self.default):
            if getattr(self.default, "requires_context", False):
                return UNRESOLVED
            return self.default()
        return self.default


class PlainParser:
    """`parse(data)`: the serializer's `validated_data` for a plainly valid request, or None
    (see the module's docstring). Built lazily, on the first request."""

    def __init__(
        self,
        serializer_class: type[serializers.Serializer],  # type: ignore[type-arg]
        *,
        resolvers: dict[str, Callable[[Any], Any]] | None = None,
    ) -> None:
        self.serializer_class = serializer_class
        self.resolvers = resolvers or {}
        self._plans: list[_Plan] | None = None
        self._names: frozenset[str] = frozenset()

    def _plan(self) -> list[_Plan]:
        cls = self.serializer_class
        if cls.validate is not serializers.Serializer.validate or getattr(
            getattr(cls, "Meta", None), "validators", None
        ):
            raise TypeError(f"{cls.__name__} validates as a whole: a plain parse cannot")
        plans = []
        for name, field in cls._declared_fields.items():
            if field.read_only:
                continue
            if field.source not in (None, name) or hasattr(cls, f"validate_{name}"):
                raise TypeError(f"{cls.__name__}.{name}: a plain parse cannot validate it")
            check = self.resolvers.get(name) or _plain_check(field)
            plans.append(_Plan(name, field, check))
        self._names = frozenset(p.name for p in plans)
        return plans

    def parse(self, data: Any) -> dict[str, Any] | None:
        if self._plans is None:
            self._plans = self._plan()
        if type(data) is not dict or not data.keys() <= self._names:
            return None  # not an object, or unknown fields: the serializer says so
        out: dict[str, Any] = {}
        for plan in self._plans:
            value = data.get(plan.name, _NO)
            if value is _NO:
                parsed = plan.missing()
                if parsed is UNRESOLVED:
                    return None
                if parsed is not _NO:
                    out[plan.name] = parsed
                continue
            if value is None:
                if not plan.allow_null:
                    return None
                out[plan.name] = None
                continue
            if plan.check is None:
                return None
            parsed = plan.check(value)
            if parsed is _NO or parsed is UNRESOLVED:
                return None
            out[plan.name] = parsed
        return out
