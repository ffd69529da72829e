"""Node constraints and their meet: table tests, and brute force over small universes of
nodes and taints (the meet admits exactly the nodes, or taints, both sides admit)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from coschedule.k8s.node_constraints import (
    MAX_TERMS,
    NodeConstraints,
    key_satisfiable,
    meet_terms,
    spread_keys,
    strip_pin,
    term_conflict,
    with_spread,
)
from coschedule.k8s.nodeaffinity import pod_allows, terms_match
from coschedule.k8s.nodes import Taint
from coschedule.k8s.taints import meet_tolerations, tolerates


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    found: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        found["values"] = list(values)
    return found


def term(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(expressions)}


@pytest.mark.parametrize(
    ("expressions", "satisfiable"),
    [
        ([expr("pool", "In", "a", "b"), expr("pool", "In", "b", "c")], True),
        ([expr("pool", "In", "a"), expr("pool", "In", "b")], False),
        ([expr("pool", "In", "a"), expr("pool", "NotIn", "a")], False),
        ([expr("pool", "NotIn", "a"), expr("pool", "NotIn", "b")], True),
        ([expr("pool", "Exists"), expr("pool", "DoesNotExist")], False),
        ([expr("pool", "DoesNotExist"), expr("pool", "NotIn", "a")], True),
        ([expr("pool", "In", "a"), expr("pool", "DoesNotExist")], False),
        ([expr("cpus", "Gt", "5"), expr("cpus", "Lt", "3")], False),
        ([expr("cpus", "Gt", "5"), expr("cpus", "Lt", "7")], True),  # 6
        ([expr("cpus", "Gt", "5"), expr("cpus", "Lt", "7"), expr("cpus", "NotIn", "6")], False),
        ([expr("cpus", "Gt", "5"), expr("cpus", "Lt", "6")], False),  # no integer between
        ([expr("cpus", "In", "4", "8"), expr("cpus", "Gt", "5")], True),
        ([expr("cpus", "In", "4", "x"), expr("cpus", "Gt", "5")], False),
        ([expr("cpus", "Gt", "five")], False),
        ([expr("pool", "Sometimes", "a")], False),
        ([expr("pool", "In")], False),  # In nothing
    ],
)
def test_one_key_satisfiable(expressions: list[dict[str, Any]], satisfiable: bool) -> None:
    assert key_satisfiable(expressions) is satisfiable


def test_term_conflict_names_the_key_with_the_node_selector() -> None:
    wanted = term(expr("pool", "In", "b"), expr("arch", "In", "amd64"))
    assert term_conflict(wanted, {"pool": "a"}) == "pool"
    assert term_conflict(wanted, {"pool": "b", "zone": "z1"}) is None
    assert term_conflict({}, {}) == ""  # an empty term matches no node
    fields = {"matchFields": [expr("metadata.name", "In", "n1"), expr("metadata.name", "In", "n2")]}
    assert term_conflict(fields, {}) == "metadata.name"
    assert term_conflict({"matchFields": [expr("metadata.uid", "In", "x")]}, {}) == ""


# ---- the meet of required terms: exactly the nodes both allow ---------------------------

_LABELS = {"pool": ("a", "b", "c", None), "zone": ("z1", "z2", None)}
NODES = [
    (f"n{i}", {k: v for k, v in zip(_LABELS, values, strict=True) if v is not None})
    for i, values in enumerate(itertools.product(*_LABELS.values()))
]
SIDES: list[tuple[dict[str, Any], ...] | None] = [
    None,
    (term(expr("pool", "In", "a", "b")),),
    (term(expr("pool", "In", "c")), term(expr("zone", "In", "z1"))),
    (term(expr("pool", "NotIn", "a"), expr("zone", "Exists")),),
    (term(expr("pool", "DoesNotExist")), term(expr("zone", "In", "z2"), expr("pool", "In", "b"))),
    ({"matchFields": [expr("metadata.name", "In", "n1", "n5", "n30")]},),
]


def _allows(terms: tuple[Any, ...] | None, selector: dict[str, str], node: Any) -> bool:
    name, labels = node
    return pod_allows(selector, terms, labels, name)


@pytest.mark.parametrize("selector", [{}, {"pool": "b"}, {"zone": "z1"}])
@pytest.mark.parametrize(("a", "b"), list(itertools.product(SIDES, SIDES)))
def test_meet_terms_allows_exactly_the_nodes_both_allow(
    a: tuple[Any, ...] | None, b: tuple[Any, ...] | None, selector: dict[str, str]
) -> None:
    met = meet_terms(a, b, selector)
    for node in NODES:
        both = _allows(a, selector, node) and _allows(b, selector, node)
        got = met != () and _allows(met, selector, node)
        assert got == both, (node, met)
    if met:
        # No term in the meet is one no node could satisfy.
        assert all(term_conflict(t, selector) is None for t in met)


def test_meet_of_equal_terms_is_the_terms_and_none_with_none_is_none() -> None:
    terms = (term(expr("pool", "In", "a")),)
    assert meet_terms(terms, terms, {}) == terms
    assert meet_terms(None, None, {}) is None
    assert meet_terms(None, terms, {}) == terms


def test_contradictory_meet_is_empty() -> None:
    assert meet_terms((term(expr("pool", "In", "a")),), (term(expr("pool", "In", "b")),), {}) == ()


def test_the_cross_product_is_bounded_and_still_only_admits_nodes_both_allow() -> None:
    a = tuple(term(expr("x", "NotIn", str(i))) for i in range(10))
    b = tuple(term(expr("y", "NotIn", str(i))) for i in range(10))
    met = meet_terms(a, b, {})
    assert met is not None
    assert len(met) == MAX_TERMS
    for labels in ({"x": "0", "y": "0"}, {"x": "3", "y": "4"}, {}):
        if terms_match(met, labels, "n"):
            assert terms_match(a, labels, "n")
            assert terms_match(b, labels, "n")


def test_node_constraints_meet() -> None:
    a = NodeConstraints({"pool": "a"}, None, ({"key": "gpu", "operator": "Exists"},))
    b = NodeConstraints({"zone": "z1"}, (term(expr("pool", "In", "a", "b")),), ())
    met = a.meet(b)
    assert met is not None
    assert met.node_selector == {"pool": "a", "zone": "z1"}
    assert met.terms == (term(expr("pool", "In", "a", "b")),)
    assert met.tolerations == ()  # b tolerates nothing
    assert a.meet(a) is a
    # One key asked two values, or a selector the other's terms exclude: no node.
    assert a.meet(NodeConstraints({"pool": "b"})) is None
    assert a.meet(NodeConstraints({}, (term(expr("pool", "In", "b")),))) is None
    assert met.affinity() == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [expr("pool", "In", "a", "b")]}]
        }
    }
    assert NodeConstraints({}).affinity() is None
    assert not NodeConstraints({"pool": "a"}, (term(expr("pool", "In", "b")),)).satisfiable()


def test_strip_pin_takes_out_our_pin_only() -> None:
    pin = expr("metadata.name", "In", "node-1")
    own = term(expr("pool", "In", "a"))
    pinned = (
        {**own, "matchFields": [pin]},
        {"matchFields": [pin, expr("metadata.name", "NotIn", "x")]},
    )
    assert strip_pin(pinned, "node-1") == (
        own,
        {"matchFields": [expr("metadata.name", "NotIn", "x")]},
    )
    # The pin's own term (the pod had no requirement): no requirement.
    assert strip_pin(({"matchFields": [pin]},), "node-1") is None
    # Another node's pin, or no pin mark: the user's own requirement, kept.
    assert strip_pin(({"matchFields": [pin]},), "node-2") == ({"matchFields": [pin]},)
    assert strip_pin(None, "node-1") is None


def test_spread_constraints_require_their_key() -> None:
    spec = {
        "topologySpreadConstraints": [
            {"topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "maxSkew": 1},
            {"topologyKey": "rack", "whenUnsatisfiable": "ScheduleAnyway", "maxSkew": 1},
            {"topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", "maxSkew": 2},
        ]
    }
    assert spread_keys(spec) == ("zone",)
    assert with_spread(None, ("zone",)) == (term(expr("zone", "Exists")),)
    assert with_spread((term(expr("pool", "In", "a")),), ("zone",)) == (
        term(expr("pool", "In", "a"), expr("zone", "Exists")),
    )
    assert with_spread(None, ()) is None


# ---- the meet of tolerations: exactly the taints both tolerate ---------------------------

TAINTS = [
    Taint(key, value, effect)
    for key in ("dedicated", "gpu", "node.kubernetes.io/not-ready")
    for value in ("", "ci", "ml")
    for effect in ("NoSchedule", "NoExecute", "PreferNoSchedule")
]
TOLERATION_SIDES: list[list[dict[str, Any]]] = [
    [],
    [{"operator": "Exists"}],
    [{"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}],
    [{"key": "dedicated", "operator": "Exists"}, {"key": "gpu", "value": "ml"}],
    [{"effect": "NoSchedule", "operator": "Exists"}, {"key": "dedicated", "value": "ml"}],
    [
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
    ],
    [{"key": "", "operator": "Equal", "value": "x"}],  # invalid: tolerates nothing
]


def _tolerated(tolerations: Any, taint: Taint) -> bool:
    # Scheduling sees a NoExecute toleration with tolerationSeconds as tolerating; the
    # placeholder's eviction rule (``tolerates``) does not. Compare both readings.
    return any(tolerates(t, taint) for t in tolerations)


def _tolerated_for_scheduling(tolerations: Any, taint: Taint) -> bool:
    return any(
        tolerates({k: v for k, v in t.items() if k != "tolerationSeconds"}, taint)
        for t in tolerations
    )


@pytest.mark.parametrize(("a", "b"), list(itertools.product(TOLERATION_SIDES, TOLERATION_SIDES)))
def test_meet_tolerations_tolerates_exactly_what_both_tolerate(
    a: list[dict[str, Any]], b: list[dict[str, Any]]
) -> None:
    met = meet_tolerations(a, b)
    for taint in TAINTS:
        for reading in (_tolerated, _tolerated_for_scheduling):
            both = reading(a, taint) and reading(b, taint)
            assert reading(met, taint) == both, (taint, met, reading.__name__)


def test_meet_of_equal_tolerations_keeps_them_as_written() -> None:
    same = TOLERATION_SIDES[3]
    assert meet_tolerations(same, list(same)) == tuple(same)
    # A toleration the other side covers is kept as written, not rebuilt.
    narrow = TOLERATION_SIDES[2]
    assert meet_tolerations(narrow, [{"operator": "Exists"}]) == tuple(narrow)
