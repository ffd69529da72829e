"""Where a pod may be scheduled, as far as the node's labels, name and taints decide it, and
the meet of two such constraints: the nodes where both pods may go. Pure.

A run's placeholder must go only where every pod of the run can follow it, so it carries
the meet of its pods' constraints:

- ``nodeSelector``: the union of the maps (one key asked two values: no node);
- required node affinity: terms are ORed, the expressions of one term ANDed, so the meet
  of two term lists is their cross product (each pair of terms ANDed), with the pairs no
  node can satisfy dropped. The product is bounded (``MAX_TERMS``): dropping ORed terms
  leaves a subset of the nodes, so a truncated meet still admits only nodes both allow;
- tolerations: the taints both pods tolerate (``taints.meet_tolerations``);
- topology spread constraints (``DoNotSchedule``): the scheduler filters out a node without
  the constraint's ``topologyKey`` label, so each adds ``<key> Exists`` to every term. The
  skew itself counts other pods and changes as they come and go: not a node constraint.

Satisfiability is decided on the expressions alone (no node list): a term is unsatisfiable
when the requirements it puts on one key cannot all hold for any value (``pool In [a]`` and
``pool In [b]``; ``Exists`` and ``DoesNotExist``; ``Gt 5`` and ``Lt 3``), so such a term
allows no node of any cluster, now or later.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coschedule.k8s.constants import REQUIRED
from coschedule.k8s.nodeaffinity import NAME_FIELD
from coschedule.k8s.taints import meet_tolerations

# Terms kept of a meet's cross product (the API itself has no limit; a run's pods rarely
# carry more than a few). Dropping ORed terms only narrows where the placeholder may go.
MAX_TERMS = 16
_EXPRESSIONS = "matchExpressions"
_FIELDS = "matchFields"
_TERMS = "nodeSelectorTerms"

Term = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class NodeConstraints:
    """A pod's node constraints: ``terms`` None means no required node affinity."""

    node_selector: Mapping[str, str]
    terms: tuple[Term, ...] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def meet(self, other: NodeConstraints) -> NodeConstraints | None:
        """The constraints of a pod that may go only where both may; None: no node."""
        if other == self:
            return self
        selector = dict(self.node_selector)
        for key, value in other.node_selector.items():
            if selector.setdefault(key, value) != value:
                return None
        terms = meet_terms(self.terms, other.terms, selector)
        if terms == ():
            return None
        return NodeConstraints(
            selector, terms, meet_tolerations(self.tolerations, other.tolerations)
        )

    def satisfiable(self) -> bool:
        """Some node could satisfy the nodeSelector and the required node affinity."""
        if self.terms is None:
            return True
        return any(term_satisfiable(t, self.node_selector) for t in self.terms)

    def affinity(self) -> dict[str, Any] | None:
        """The ``nodeAffinity`` that carries ``terms`` (None: no requirement)."""
        if self.terms is None:
            return None
        return {REQUIRED: {_TERMS: [_plain(t) for t in self.terms]}}


def _plain(term: Term) -> dict[str, Any]:
    return {k: [dict(e) for e in term[k]] for k in (_EXPRESSIONS, _FIELDS) if term.get(k)}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _values(expression: Mapping[str, Any]) -> list[str]:
    return [str(v) for v in _list(expression.get("values"))]


def key_satisfiable(expressions: Iterable[Mapping[str, Any]]) -> bool:
    """Can one value of a label (None: absent) satisfy all these requirements on it?"""
    absent_ok = True  # the label may be absent
    present_ok = True  # the label may be present
    allowed: set[str] | None = None  # None: any value
    excluded: set[str] = set()
    low: int | None = None  # value > low
    high: int | None = None  # value < high
    for expression in expressions:
        operator = expression.get("operator")
        values = _values(expression)
        if operator == "In":
            absent_ok = False
            allowed = set(values) if allowed is None else allowed & set(values)
        elif operator == "NotIn":
            excluded.update(values)
        elif operator == "Exists":
            absent_ok = False
        elif operator == "DoesNotExist":
            present_ok = False
        elif operator in ("Gt", "Lt"):
            absent_ok = False
            try:
                bound = int(values[0])
            except (ValueError, IndexError):
                return False  # matches no node
            if operator == "Gt":
                low = bound if low is None else max(low, bound)
            else:
                high = bound if high is None else min(high, bound)
        else:
            return False  # an unknown operator matches nothing
    if absent_ok:
        return True
    if not present_ok:
        return False

    def in_range(value: str) -> bool:
        if low is None and high is None:
            return True
        try:
            number = int(value)
        except ValueError:
            return False
        return (low is None or number > low) and (high is None or number < high)

    if allowed is not None:
        return any(v not in excluded and in_range(v) for v in allowed)
    if low is None or high is None:
        return True  # infinitely many values remain
    numbers = set(range(low + 1, high)) if high - low <= len(excluded) + 1 else None
    if numbers is None:
        return True  # more integers in range than excluded values
    return any(str(n) not in excluded for n in numbers)


def _alone(expression: Mapping[str, Any]) -> bool:
    """Whether one expression by itself can hold for some value of its key."""
    operator = expression.get("operator")
    if operator in ("NotIn", "Exists", "DoesNotExist"):
        return True
    if operator == "In":
        return bool(expression.get("values"))
    return key_satisfiable((expression,))


def term_conflict(term: Term, node_selector: Mapping[str, str]) -> str | None:
    """The key whose requirements in ``term`` (with the nodeSelector) no node can meet;
    "" for an empty or malformed term (it matches no node); None: satisfiable."""
    expressions = _list(term.get(_EXPRESSIONS))
    fields = _list(term.get(_FIELDS))
    if not expressions and not fields:
        return ""
    if not fields:
        # The admission hot path: most terms ask one thing of each key, none the
        # nodeSelector names; then each expression alone decides.
        keys: set[Any] = set()
        for expression in expressions:
            if not isinstance(expression, Mapping):
                return ""
            key = expression.get("key")
            if key in keys or key in node_selector:
                break
            keys.add(key)
            if not _alone(expression):
                return str(key)
        else:
            return None
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for expression in expressions:
        if not isinstance(expression, Mapping):
            return ""
        by_key.setdefault(str(expression.get("key")), []).append(expression)
    for key, value in node_selector.items():
        if key in by_key:
            by_key[key].append({"key": key, "operator": "In", "values": [value]})
    for key, found in by_key.items():
        if not key_satisfiable(found):
            return key
    named = []
    for requirement in fields:
        if not isinstance(requirement, Mapping) or requirement.get("key") != NAME_FIELD:
            return ""
        named.append(requirement)
    if named and not key_satisfiable(named):
        return NAME_FIELD
    return None


def term_satisfiable(term: Term, node_selector: Mapping[str, str]) -> bool:
    return term_conflict(term, node_selector) is None


def _and(a: Term, b: Term) -> dict[str, Any]:
    """One term requiring both (identical requirements once)."""
    result: dict[str, Any] = {}
    for key in (_EXPRESSIONS, _FIELDS):
        merged = list(_list(a.get(key)))
        merged += [e for e in _list(b.get(key)) if e not in merged]
        if merged:
            result[key] = merged
    return result


def meet_terms(
    a: Sequence[Term] | None, b: Sequence[Term] | None, node_selector: Mapping[str, str]
) -> tuple[Term, ...] | None:
    """The required terms of both (None: neither requires anything; (): no node)."""
    if a is None and b is None:
        return None
    if a is None or b is None or a == b:
        only = a if a is not None else b
        assert only is not None
        return tuple(t for t in only if term_satisfiable(t, node_selector))[:MAX_TERMS]
    product: list[Term] = []
    for left in a:
        for right in b:
            both = _and(left, right)
            if both not in product and term_satisfiable(both, node_selector):
                product.append(both)
                if len(product) == MAX_TERMS:
                    return tuple(product)
    return tuple(product)


def strip_pin(terms: Sequence[Term] | None, pinned: str | None) -> tuple[Term, ...] | None:
    """The pod's own terms without our pin to ``pinned`` (``matchFields metadata.name In
    [pinned]``, ANDed into each term by placement by node name). A term that was our pin
    alone was added with it: the pod had no requirement of its own."""
    if terms is None or not pinned:
        return tuple(terms) if terms is not None else None
    pin = {"key": NAME_FIELD, "operator": "In", "values": [pinned]}
    result: list[Term] = []
    for term in terms:
        fields = _list(term.get(_FIELDS))
        if pin not in fields:
            result.append(term)
            continue
        rest = [f for f in fields if f != pin]
        own = {k: v for k, v in term.items() if k != _FIELDS}
        if rest:
            own[_FIELDS] = rest
        if not _list(own.get(_EXPRESSIONS)) and not rest:
            return None  # the pin's own term: no requirement of the pod's
        result.append(own)
    return tuple(result)


def spread_keys(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The topology keys of the pod's ``DoNotSchedule`` spread constraints: a node without
    the label is filtered out."""
    keys: list[str] = []
    for constraint in _list(spec.get("topologySpreadConstraints")):
        if not isinstance(constraint, Mapping):
            continue
        key = constraint.get("topologyKey")
        unsatisfiable = constraint.get("whenUnsatisfiable")
        if unsatisfiable == "DoNotSchedule" and isinstance(key, str) and key and key not in keys:
            keys.append(key)
    return tuple(keys)


def and_expressions(
    terms: Sequence[Term] | None, expressions: Sequence[Mapping[str, Any]]
) -> tuple[Term, ...] | None:
    """``terms`` with ``expressions`` ANDed into each (a term of their own when none)."""
    if not expressions:
        return tuple(terms) if terms is not None else None
    extra = {_EXPRESSIONS: [dict(e) for e in expressions]}
    if terms is None:
        return (extra,)
    return tuple(_and(t, extra) for t in terms)


def with_spread(terms: Sequence[Term] | None, keys: Sequence[str]) -> tuple[Term, ...] | None:
    """``terms`` with ``<key> Exists`` ANDed into each (a term of its own when none)."""
    return and_expressions(terms, [{"key": k, "operator": "Exists"} for k in keys])
