"""A ConcurrencyControl's LabelSelector, parsed with the API server's rules and messages.

The parsed form and its matching are the ones the scheduling defaults use
(``Selector``/``Requirement``); only the messages differ (they name the control's fields).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from coschedule.config.scheduling_defaults import Requirement, Selector

__all__ = ["BadSelector", "Requirement", "Selector", "parse_selector", "valid_label_value"]

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class BadSelector(ValueError):
    """The selector is not valid; the message names the field."""


def valid_label_value(value: str) -> bool:
    return len(value) <= 63 and _VALUE.match(value) is not None


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (a qualified name), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"prefix {prefix!r} must be a DNS subdomain of at most 253 characters"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            f"name {name!r} must be 1-63 characters, alphanumeric at both ends, with '-', "
            "'_' or '.' between"
        )
    return None


def parse_selector(doc: Any, where: str = "spec.selector") -> Selector:
    if not isinstance(doc, Mapping):
        raise BadSelector(f"{where} must be an object (a LabelSelector; {{}} selects all runs)")
    unknown = set(doc) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise BadSelector(f"{where} has unknown field(s) {sorted(unknown)}")
    labels = doc.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise BadSelector(f"{where}.matchLabels must be a map of label key to value")
    pairs: list[tuple[str, str]] = []
    for key, value in labels.items():
        problem = label_key_problem(str(key))
        if problem:
            raise BadSelector(f"{where}.matchLabels: key {key!r}: {problem}")
        if not isinstance(value, str) or not valid_label_value(value):
            raise BadSelector(f"{where}.matchLabels[{key}]: {value!r} is not a valid label value")
        pairs.append((str(key), value))
    expressions = doc.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise BadSelector(f"{where}.matchExpressions must be a list")
    reqs: list[Requirement] = []
    for i, expr in enumerate(expressions):
        at = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise BadSelector(f"{at} must be an object with key, operator and values")
        key = expr.get("key")
        if not isinstance(key, str):
            raise BadSelector(f"{at}.key is required")
        problem = label_key_problem(key)
        if problem:
            raise BadSelector(f"{at}.key: {problem}")
        operator = expr.get("operator")
        if operator not in OPERATORS:
            raise BadSelector(f"{at}.operator: {operator!r} is not one of {', '.join(OPERATORS)}")
        values = expr.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise BadSelector(f"{at}.values must be a list of strings")
        if operator in ("In", "NotIn") and not values:
            raise BadSelector(f"{at}.values: operator {operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            raise BadSelector(f"{at}.values: operator {operator} takes no values")
        reqs.append(Requirement(key, str(operator), tuple(values)))
    return Selector(tuple(sorted(pairs)), tuple(reqs))
