"""The `money` filter (a builtin: every template has it): `{{ invoice.total|money }}`."""

from __future__ import annotations

from decimal import Decimal

from django import template

from portal.money import format_money

register = template.Library()


@register.filter(name="money")
def money(amount: Decimal | int | float | str | None, places: int = 2) -> str:
    """ "−$0.43", not "$-0.43"; `|money:4` for a rate per GPU-hour."""
    return format_money(amount, places=int(places))


@register.filter(name="money_negated")
def money_negated(amount: Decimal | int | float | str | None, places: int = 2) -> str:
    """The amount taken off, as money: `{{ invoice.credits_applied|money_negated }}` is "−$5.00"."""
    if amount is None or amount == "":
        return ""
    try:
        return format_money(-Decimal(str(amount)), places=int(places))
    except ArithmeticError:
        return ""
