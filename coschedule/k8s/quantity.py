"""Kubernetes resource quantities ("500m", "2Gi", "1e3") as numbers, and back for people."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
# The API's grammar: a number, then a decimal exponent or a suffix (not both).
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$")


def quantity(text: Any) -> Decimal | None:
    """A Kubernetes quantity ("500m", "2Gi", "1e3", 4) as a number; None if malformed."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        return None
    number, unit = match.group(1), match.group(2) or ""
    try:
        if unit[:1] in ("e", "E") and len(unit) > 1:
            return Decimal(number + unit)
        return Decimal(number) * _SUFFIXES[unit]
    except InvalidOperation:
        return None


def resources(values: Any) -> dict[str, Decimal]:
    """A ``{name: quantity}`` map (requests, allocatable) as numbers; bad entries dropped."""
    result: dict[str, Decimal] = {}
    if isinstance(values, dict):
        for name, text in values.items():
            amount = quantity(text)
            if amount is not None:
                result[str(name)] = amount
    return result


def show(name: str, amount: Decimal) -> str:
    """A quantity as a person reads it: cpu in cores, memory in Mi/Gi, counts as counts."""
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if amount >= size:
                return f"{round(amount / size, 2).normalize():f}{unit}"
        return f"{amount.normalize():f}"
    return f"{round(amount, 3).normalize():f}"
