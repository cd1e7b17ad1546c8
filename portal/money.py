"""How an amount of money is written, everywhere: pages, e-mails, PDFs, messages.

`format_money(Decimal("-0.43"))` is "−$0.43": the sign (a true minus, U+2212) before the
currency symbol, thousands grouped, rounded half-up to the cent. The currency is the
installation's (`BILLING_CURRENCY`: one currency per installation, docs/billing.md).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings

MINUS = "\u2212"
CENT = Decimal("0.01")
SYMBOLS = {"usd": "$", "eur": "€", "gbp": "£", "jpy": "¥", "chf": "CHF "}


def currency_symbol(currency: str | None = None) -> str:
    code = str(currency or getattr(settings, "BILLING_CURRENCY", None) or "usd").lower()
    return SYMBOLS.get(code, f"{code.upper()} ")


def format_money(
    amount: Decimal | int | float | str | None, currency: str | None = None, *, places: int = 2
) -> str:
    """`amount` as money: "$1,234.50", "−$0.43"; "" for None or what is not a number.
    `places` > 2 shows more digits (rates per GPU-hour have 4)."""
    if amount is None or amount == "":
        return ""
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        return ""
    if not value.is_finite():
        return ""
    value = value.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP)
    sign = MINUS if value < 0 else ""
    return f"{sign}{currency_symbol(currency)}{abs(value):,.{places}f}"
