"""ConcurrencyControl parsing and label selectors: what the API server accepts, parsed; what
it refuses, refused with the same field names."""

from __future__ import annotations

from typing import Any

import pytest

from coschedule.concurrency.control import DEFAULT_KINDS, BadControl, parse_control
from coschedule.concurrency.selector import parse_selector
from coschedule.engines import Kind, Order, Strategy
from coschedule.k8s.selectors import Requirement, Selector
from tests.concurrency.runs import control


def test_defaults_follow_the_crd() -> None:
    parsed = parse_control(control("ci", {"selector": {}, "strategy": "Cancel"}))
    assert parsed.namespace == "ci"
    assert parsed.name == "ci"
    assert parsed.kinds == DEFAULT_KINDS
    assert parsed.key.text == ""
    assert parsed.max_running == 1
    assert parsed.strategy is Strategy.CANCEL
    assert parsed.selector == Selector()
    assert parsed.order is Order.OLDEST_FIRST


def test_replace_takes_max_running_and_queue_an_order() -> None:
    replace = parse_control(control("r", {"selector": {}, "strategy": "Replace", "maxRunning": 2}))
    assert (replace.strategy, replace.max_running) == (Strategy.REPLACE, 2)
    queue = parse_control(
        control("q", {"selector": {}, "strategy": "Queue", "order": "newest-first"})
    )
    assert queue.order is Order.NEWEST_FIRST


def test_a_full_control() -> None:
    parsed = parse_control(
        control(
            "deploys",
            {
                "selector": {
                    "matchLabels": {"app": "deploy"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}],
                },
                "kinds": ["Workflow"],
                "key": "$(params.environment)",
                "strategy": "Queue",
                "maxRunning": 3,
            },
        )
    )
    assert parsed.kinds == frozenset({Kind.WORKFLOW})
    assert parsed.max_running == 3
    assert parsed.selector.match_labels == (("app", "deploy"),)
    assert parsed.selector.expressions == (Requirement("tier", "In", ("a", "b")),)
    assert parsed.holds(Kind.WORKFLOW, {"app": "deploy", "tier": "a"})
    assert not parsed.holds(Kind.PIPELINE_RUN, {"app": "deploy", "tier": "a"})
    assert not parsed.holds(Kind.WORKFLOW, {"app": "deploy", "tier": "c"})


BAD: list[tuple[dict[str, Any], str]] = [
    ({"strategy": "Cancel"}, "spec.selector is required"),
    ({"selector": {}, "strategy": "Drop"}, "spec.strategy: 'Drop' is not one of"),
    ({"selector": {}}, "spec.strategy is required"),
    ({"selector": {}, "strategy": "Queue", "maxRunning": 0}, "spec.maxRunning must be"),
    ({"selector": {}, "strategy": "Queue", "maxRunning": True}, "spec.maxRunning must be"),
    ({"selector": {}, "strategy": "Cancel", "maxRunning": 0}, "spec.maxRunning must be"),
    ({"selector": {}, "strategy": "Replace", "maxPending": 1}, "spec.maxPending applies"),
    ({"selector": {}, "strategy": "Queue", "maxPending": -1}, "spec.maxPending must be"),
    ({"selector": {}, "strategy": "Queue", "overflow": "CancelNewest"}, "spec.overflow needs"),
    (
        {"selector": {}, "strategy": "Queue", "maxPending": 1, "overflow": "Drop"},
        "spec.overflow: 'Drop' is not one of CancelNewest, CancelOldest",
    ),
    ({"selector": {}, "strategy": "Cancel", "maxWaitSeconds": 60}, "spec.maxWaitSeconds applies"),
    ({"selector": {}, "strategy": "Queue", "maxWaitSeconds": 0}, "spec.maxWaitSeconds must be"),
    ({"selector": {}, "strategy": "Replace", "priority": "1"}, "spec.priority applies"),
    ({"selector": {}, "strategy": "Queue", "kueue": "Admit"}, "spec.kueue: 'Admit' is not one of"),
    ({"selector": {}, "strategy": "Queue", "priority": "$(foo.x)"}, "spec.priority: unknown"),
    ({"selector": {}, "strategy": "Queue", "priority": 5}, "spec.priority must be a string"),
    ({"selector": {}, "strategy": "Replace", "maxRunning": 0}, "spec.maxRunning must be"),
    ({"selector": {}, "strategy": "Queue", "order": "random"}, "spec.order: 'random' is not"),
    ({"selector": {}, "strategy": "Replace", "order": "newest-first"}, "spec.order applies"),
    ({"selector": {}, "strategy": "Cancel", "order": "oldest-first"}, "spec.order applies"),
    ({"selector": {}, "strategy": "Cancel", "kinds": ["Job"]}, "spec.kinds[0]"),
    ({"selector": {}, "strategy": "Cancel", "kinds": []}, "spec.kinds must be"),
    ({"selector": {}, "strategy": "Cancel", "key": "$(params.x"}, "spec.key: unclosed"),
    ({"selector": {}, "strategy": "Cancel", "key": "$(foo.x)"}, "spec.key: unknown reference"),
    ({"selector": {}, "strategy": "Cancel", "extra": 1}, "unknown field(s) ['extra']"),
    (
        {"selector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}, "strategy": "Cancel"},
        "spec.selector.matchExpressions[0].operator",
    ),
    (
        {
            "selector": {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
            "strategy": "Cancel",
        },
        "spec.selector.matchExpressions[0].values: operator In needs",
    ),
    (
        {
            "selector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "strategy": "Cancel",
        },
        "operator Exists takes no values",
    ),
    (
        {"selector": {"matchLabels": {"bad key!": "x"}}, "strategy": "Cancel"},
        "spec.selector.matchLabels: key 'bad key!'",
    ),
    (
        {"selector": {"matchLabels": {"app": "-x"}}, "strategy": "Cancel"},
        "spec.selector.matchLabels[app]",
    ),
    ({"selector": [], "strategy": "Cancel"}, "spec.selector must be an object"),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_invalid_controls_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(BadControl) as refused:
        parse_control(control("c", spec))
    assert message in str(refused.value)


def test_a_name_longer_than_a_label_name_is_refused() -> None:
    with pytest.raises(BadControl, match=r"metadata\.name must be at most 63"):
        parse_control(control("c" * 64, {"selector": {}, "strategy": "Cancel"}))


def test_selector_operators() -> None:
    selector = parse_selector(
        {
            "matchExpressions": [
                {"key": "a", "operator": "In", "values": ["1", "2"]},
                {"key": "b", "operator": "NotIn", "values": ["x"]},
                {"key": "c", "operator": "Exists"},
                {"key": "d", "operator": "DoesNotExist"},
            ]
        }
    )
    assert selector.matches({"a": "1", "c": ""})
    assert selector.matches({"a": "2", "b": "y", "c": "z"})
    assert not selector.matches({"a": "3", "c": ""})  # In
    assert not selector.matches({"a": "1", "b": "x", "c": ""})  # NotIn
    assert not selector.matches({"a": "1"})  # Exists
    assert not selector.matches({"a": "1", "c": "", "d": "here"})  # DoesNotExist


def test_not_in_matches_a_missing_label_as_kubernetes_does() -> None:
    selector = parse_selector(
        {"matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]}]}
    )
    assert selector.matches({})


def test_empty_selector_matches_everything() -> None:
    assert parse_selector({}).matches({})
    assert parse_selector({"matchLabels": {}}).matches({"any": "thing"})


def test_a_control_holds_a_run_kueue_admits_only_when_it_says_so() -> None:
    kueue = {"app": "ci", "kueue.x-k8s.io/queue-name": "team-a"}
    spec = {"selector": {"matchLabels": {"app": "ci"}}, "strategy": "Queue"}
    assert not parse_control(control("c", spec)).holds(Kind.PIPELINE_RUN, kueue)
    assert parse_control(control("c", spec)).holds(Kind.PIPELINE_RUN, {"app": "ci"})
    for mode in ("Group", "Hold"):
        parsed = parse_control(control("c", {**spec, "kueue": mode}))
        assert parsed.kueue.value == mode
        assert parsed.holds(Kind.PIPELINE_RUN, kueue)
