"""The key template: parsing, expansion, label values, and agreement with the CRD's CEL."""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from coschedule.concurrency.template import (
    GRAMMAR,
    UNCLOSED,
    BadTemplate,
    Ref,
    label_value,
    parse_template,
)

CRD = Path(__file__).resolve().parents[2] / "manifests" / "crds" / "crd-concurrencycontrol.yaml"


def test_parses_references_and_literals() -> None:
    template = parse_template("deploy-$(params.env)/$(labels.team)@$(context.namespace)")
    assert template.parts == (
        "deploy-",
        Ref("params", "env"),
        "/",
        Ref("labels", "team"),
        "@",
        Ref("context", "namespace"),
    )


def test_label_and_annotation_keys_may_hold_prefixes() -> None:
    template = parse_template("$(labels.app.kubernetes.io/name)$(annotations.example.com/x)")
    assert template.parts == (
        Ref("labels", "app.kubernetes.io/name"),
        Ref("annotations", "example.com/x"),
    )


def test_expands_every_source_and_missing_is_empty() -> None:
    template = parse_template(
        "$(params.branch)|$(params.nope)|$(labels.a)|$(annotations.b)|$(context.namespace)"
    )
    key = template.expand("ci", {"a": "A"}, {"b": "B"}, {"branch": "main"})
    assert key == "main||A|B|ci"


def test_array_and_object_params_expand_to_stable_json() -> None:
    template = parse_template("$(params.list)/$(params.obj)")
    key = template.expand("ns", {}, {}, {"list": ["a", "b"], "obj": {"z": 1, "a": "x"}})
    assert key == '["a","b"]/{"a":"x","z":1}'


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("$(params.branch", "unclosed '$('"),
        ("a-$(", "unclosed '$('"),
        ("$(foo.x)", "unknown reference $(foo.x)"),
        ("$(params.)", "unknown reference $(params.)"),
        ("$(context.name)", "unknown reference $(context.name)"),
        ("$(params.a b)", "unknown reference"),
        ("$$(nope)", "unknown reference $(nope)"),
    ],
)
def test_malformed_templates_are_refused_naming_the_field(text: str, fragment: str) -> None:
    with pytest.raises(BadTemplate) as refused:
        parse_template(text)
    assert str(refused.value).startswith("spec.key")
    assert fragment in str(refused.value)


@pytest.mark.parametrize(
    "text", ["", "plain", "$", "a$", "$a", "$$", "cost: $5", "$$(params.x)", "())"]
)
def test_dollar_signs_outside_references_are_literal(text: str) -> None:
    parse_template(text)


def test_label_value_is_the_key_when_valid() -> None:
    assert label_value("main") == "main"
    assert label_value("") == ""
    assert label_value("release-1.2_x") == "release-1.2_x"


@pytest.mark.parametrize("key", ["feature/login", "a" * 64, "-lead", "trail-", "ümlaut", "x y"])
def test_label_value_hashes_what_is_not_a_label_value(key: str) -> None:
    value = label_value(key)
    assert value == hashlib.sha256(key.encode()).hexdigest()[:16]
    assert re.fullmatch(r"[0-9a-f]{16}", value)


# ---- the CRD's CEL rules accept exactly what the parser accepts -----------------------


@functools.cache
def _programs() -> list[Any]:
    cel = pytest.importorskip("cel")
    return [cel.compile(rule) for rule in _key_rules()]


def _key_rules() -> list[str]:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    key = schema["properties"]["spec"]["properties"]["key"]
    return [rule["rule"] for rule in key["x-kubernetes-validations"]]


def _cel_accepts(programs: list[Any], text: str) -> bool:
    return all(program.execute({"self": text}) is True for program in programs)


def _parser_accepts(text: str) -> bool:
    try:
        parse_template(text)
    except BadTemplate:
        return False
    return True


def test_crd_rules_use_the_parsers_regular_expressions() -> None:
    rules = _key_rules()
    assert any(UNCLOSED in rule for rule in rules)
    assert any(GRAMMAR in rule for rule in rules)


_ALPHABET = st.sampled_from(
    [
        "$",
        "(",
        ")",
        ".",
        "/",
        "-",
        "a",
        "Z",
        "0",
        " ",
        "params",
        "labels",
        "annotations",
        "context",
        "namespace",
        "$(",
        "$(params.",
        "$(labels.",
        "$(context.namespace)",
        "x",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_ALPHABET, max_size=12).map("".join))
def test_cel_and_parser_agree(text: str) -> None:
    assert _cel_accepts(_programs(), text) == _parser_accepts(text), text
