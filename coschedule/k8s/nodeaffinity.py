"""Kubernetes node selection rules, pure: does a node (its labels and name) satisfy a
nodeSelector, a required node affinity, or a PersistentVolume's node affinity?

The semantics are the API's (``k8s.io/component-helpers/scheduling/corev1/nodeaffinity``):
terms are ORed, the expressions of one term ANDed; an empty term list matches nothing, an
empty term matches nothing; ``matchFields`` knows only ``metadata.name``. Tolerant of bad
shapes (they come from caches): a malformed expression matches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coschedule.k8s.constants import REQUIRED

NAME_FIELD = "metadata.name"


def _values(expression: Mapping[str, Any]) -> list[str]:
    values = expression.get("values")
    return [str(v) for v in values] if isinstance(values, list) else []


def expression_matches(expression: Mapping[str, Any], value: str | None) -> bool:
    """One requirement against the node's value for its key (None: the node lacks it)."""
    operator = expression.get("operator")
    values = _values(expression)
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        try:
            have, bound = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """A NodeSelectorTerm: every expression and field requirement holds (empty: no)."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list):
        return False
    if not expressions and not fields:
        return False
    for expression in expressions:
        if not isinstance(expression, dict):
            return False
        if not expression_matches(expression, labels.get(str(expression.get("key")))):
            return False
    for requirement in fields:
        if not isinstance(requirement, dict) or requirement.get("key") != NAME_FIELD:
            return False
        if not expression_matches(requirement, name):
            return False
    return True


def terms_match(terms: Sequence[Mapping[str, Any]], labels: Mapping[str, str], name: str) -> bool:
    """A NodeSelector (ORed terms)."""
    return any(term_matches(term, labels, name) for term in terms)


def required_terms(affinity: Any) -> tuple[Mapping[str, Any], ...] | None:
    """The pod's required node-affinity terms; None when it has no such requirement."""
    if not isinstance(affinity, dict):
        return None
    node_affinity = affinity.get("nodeAffinity")
    if not isinstance(node_affinity, dict):
        return None
    required = node_affinity.get(REQUIRED)
    if not isinstance(required, dict):
        return None
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list):
        return None
    return tuple(t for t in terms if isinstance(t, dict))


def pod_allows(
    node_selector: Mapping[str, str],
    terms: Sequence[Mapping[str, Any]] | None,
    labels: Mapping[str, str],
    name: str,
) -> bool:
    """The pod's nodeSelector and required node affinity both admit the node."""
    if any(labels.get(k) != v for k, v in node_selector.items()):
        return False
    return terms is None or terms_match(terms, labels, name)
