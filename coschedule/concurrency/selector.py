"""A ConcurrencyControl's LabelSelector, parsed with the API server's rules and messages.

The parsed form, its matching and the name rules are ``coschedule.k8s``'s, as the
scheduling defaults use them; only the messages differ (they name the control's fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule.k8s.names import label_key_problem, valid_label_value
from coschedule.k8s.selectors import OPERATORS, Requirement, Selector


class BadSelector(ValueError):
    """The selector is not valid; the message names the field."""


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
