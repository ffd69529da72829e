"""The CRD's rules over the whole spec (which fields go with which strategy) refuse exactly
what ``parse_control`` refuses: the API server and ``explain`` agree. Evaluated with the
``common-expression-language`` package on specs as the API server sees them (defaults
applied); each refusal names the field, as the e2e tier checks on a real API server."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from coschedule.concurrency.control import BadControl, parse_control
from coschedule.engines import Order, Overflow, Strategy
from tests.concurrency.runs import control

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "crd-concurrencycontrol.yaml"


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


@functools.cache
def _rules() -> list[tuple[Any, str, str]]:
    cel = pytest.importorskip("cel")
    return [
        (cel.compile(r["rule"]), r.get("fieldPath", ""), r["message"])
        for r in _spec_schema()["x-kubernetes-validations"]
    ]


def _schema_accepts(spec: dict[str, Any]) -> tuple[bool, list[str]]:
    """The property schema (enum, minimum, maximum) and the CEL rules, on the spec with the
    CRD's defaults applied, as the API server validates it."""
    props = _spec_schema()["properties"]
    seen = {k: v for k, v in ((k, props[k].get("default")) for k in props) if v is not None}
    seen.update(spec)
    refused = []
    for name, value in spec.items():
        prop = props[name]
        if "enum" in prop and value not in prop["enum"]:
            refused.append(f"spec.{name}")
        if prop.get("type") == "integer" and not (
            prop.get("minimum", value) <= value <= prop.get("maximum", value)
        ):
            refused.append(f"spec.{name}")
    cel = pytest.importorskip("cel")
    for name, value in spec.items():
        for rule in props[name].get("x-kubernetes-validations", ()):
            if (
                isinstance(value, str)
                and cel.compile(rule["rule"]).execute({"self": value}) is not True
            ):
                refused.append(f"spec.{name}")
    refused += [
        f"spec{path}"
        for program, path, _ in _rules()
        if program.execute({"self": seen}) is not True
    ]
    return not refused, refused


def _parser_accepts(spec: dict[str, Any]) -> tuple[bool, str]:
    try:
        parse_control(control("c", spec))
    except BadControl as exc:
        return False, str(exc)
    return True, ""


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {}, "strategy": draw(st.sampled_from(list(Strategy)))}
    optional = {
        "maxRunning": st.integers(0, 1001),
        "order": st.sampled_from([*Order, "random"]),
        "maxPending": st.integers(-1, 100_001),
        "overflow": st.sampled_from([*Overflow, "DropAll"]),
        "maxWaitSeconds": st.integers(0, 31_536_001),
        "priority": st.sampled_from(["$(labels.priority)", "5", "$(params.urgency)", "$(foo.x)"]),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            spec[name] = draw(values)
    return spec


@settings(max_examples=100, deadline=None)
@given(specs())
# Found by this test in CI: the schema's maximum was 1000, the parser's none.
@example({"selector": {}, "strategy": Strategy.CANCEL, "maxRunning": 1001})
@example({"selector": {}, "strategy": Strategy.QUEUE, "maxRunning": 1000})
def test_the_crd_refuses_exactly_what_the_parser_refuses_naming_the_field(
    spec: dict[str, Any],
) -> None:
    crd_ok, fields = _schema_accepts(spec)
    parsed_ok, message = _parser_accepts(spec)
    assert crd_ok == parsed_ok, (spec, fields, message)
    if not parsed_ok:
        # The parser's message names one of the fields the API server names.
        assert any(message.startswith(f) for f in fields), (fields, message)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"strategy": "Replace", "maxPending": 2}, "spec.maxPending"),
        ({"strategy": "Cancel", "maxPending": 2}, "spec.maxPending"),
        ({"strategy": "Queue", "overflow": "CancelOldest"}, "spec.overflow"),
        ({"strategy": "Cancel", "maxWaitSeconds": 60}, "spec.maxWaitSeconds"),
        ({"strategy": "GracefullyStop", "maxWaitSeconds": 60}, "spec.maxWaitSeconds"),
        ({"strategy": "Replace", "priority": "$(labels.priority)"}, "spec.priority"),
        ({"strategy": "Queue", "priority": "$(labels.priority"}, "spec.priority"),
    ],
)
def test_bad_combinations_are_refused_by_a_rule_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    ok, fields = _schema_accepts({"selector": {}, **spec})
    assert not ok
    assert set(fields) == {field}


def test_good_combinations_pass_every_rule() -> None:
    for spec in (
        {"strategy": "Queue", "maxPending": 0, "overflow": "CancelNewest", "maxWaitSeconds": 1},
        {"strategy": "Replace", "maxRunning": 3, "maxWaitSeconds": 600},
        {"strategy": "GracefullyCancel", "maxRunning": 2},
        {"strategy": "Queue", "priority": "$(labels.priority)", "maxPending": 3},
    ):
        assert _schema_accepts({"selector": {}, **spec}) == (True, [])
