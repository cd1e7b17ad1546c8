"""Whole numbers from query strings and other untrusted text, without surprises.

`str.isdigit()` is true for '²' and '٣', which `int()` then refuses (a 500), and a string of
thousands of digits makes `int()` raise or yields a number no database column holds. Only ASCII
digits, at most 18 of them, are a whole number here.
"""

from __future__ import annotations

import re

_WHOLE = re.compile(r"[0-9]{1,18}")


def whole_number(raw: object, *, maximum: int = 2**63 - 1) -> int | None:
    """`raw` as a whole number from 0 to `maximum`, or None when it is anything else."""
    if not isinstance(raw, str) or not _WHOLE.fullmatch(raw):
        return None
    value = int(raw)
    return value if value <= maximum else None
