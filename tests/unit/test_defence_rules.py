"""Table-driven rules behind the portal's defences: client address, whole numbers, CSV cells."""

from __future__ import annotations

import pytest

from foundation.clientip import parse_networks, resolve_client_addr
from foundation.params import whole_number

TRUSTED = parse_networks(["10.0.0.0/8", "127.0.0.1"])


@pytest.mark.parametrize(
    ("peer", "xff", "trusted", "client"),
    [
        ("203.0.113.5", None, TRUSTED, "203.0.113.5"),  # no header
        ("203.0.113.5", "1.2.3.4", TRUSTED, "203.0.113.5"),  # untrusted peer: header ignored
        ("127.0.0.1", "1.2.3.4", (), "127.0.0.1"),  # nothing trusted: header ignored
        ("127.0.0.1", "1.2.3.4", TRUSTED, "1.2.3.4"),  # one trusted hop
        ("127.0.0.1", "6.6.6.6, 1.2.3.4, 10.1.1.1", TRUSTED, "1.2.3.4"),  # skip trusted, stop
        ("127.0.0.1", "10.0.0.2, 10.0.0.3", TRUSTED, "10.0.0.2"),  # all trusted: leftmost
        ("127.0.0.1", "1.2.3.4, junk", TRUSTED, "127.0.0.1"),  # malformed hop: believe none
        ("127.0.0.1", "2001:db8::1", TRUSTED, "2001:db8::1"),
    ],
)
def test_client_address_believes_only_trusted_proxies(peer, xff, trusted, client):
    assert resolve_client_addr(peer, xff, trusted) == client


def test_a_bad_trusted_proxy_entry_is_a_configuration_error():
    with pytest.raises(ValueError, match="not-an-ip"):
        parse_networks(["not-an-ip"])


@pytest.mark.parametrize(
    ("raw", "maximum", "value"),
    [
        ("0", 10, 0),
        ("10", 10, 10),
        ("11", 10, None),
        ("²", 10, None),
        ("٣", 10, None),
        ("-1", 10, None),
        (" 1", 10, None),
        ("9" * 19, 2**63, None),
        ("9" * 5000, 2**63, None),
        (None, 10, None),
        (7, 10, None),
    ],
)
def test_whole_numbers_are_ascii_digits_within_bounds(raw, maximum, value):
    assert whole_number(raw, maximum=maximum) == value


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("+1+1", "'+1+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tcmd", "'\tcmd"),
        ("-0.43", "-0.43"),  # a plain number stays a number
        ("train-resnet", "train-resnet"),
        (5, 5),
    ],
)
def test_csv_cells_that_would_be_formulas_are_quoted(cell, written):
    from billing.exports import csv_cell

    assert csv_cell(cell) == written
