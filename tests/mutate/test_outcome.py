"""``Decision``'s hand-written ``__init__`` (the hot path builds one per admission) sets
every field to the default its dataclass field declares, as the generated one would."""

from __future__ import annotations

import dataclasses

import pytest

from coschedule.mutate.outcome import Decision


@pytest.mark.parametrize("trace", [True, False])
@pytest.mark.parametrize("allowed", [True, False])
def test_every_field_starts_at_its_declared_default(allowed: bool, trace: bool) -> None:
    decision = Decision(allowed, trace=trace)
    fields = dataclasses.fields(Decision)
    assert {f.name for f in fields} == set(Decision.__slots__)
    for f in fields:
        if f.name == "allowed":
            expected: object = allowed
        elif f.name == "trace":
            expected = trace
        elif f.default is not dataclasses.MISSING:
            expected = f.default
        else:
            assert f.default_factory is not dataclasses.MISSING, f.name
            expected = f.default_factory()
        value = getattr(decision, f.name)
        assert value == expected, f.name
        assert type(value) is type(expected), f.name


def test_each_decision_has_lists_of_its_own() -> None:
    first, second = Decision(True), Decision(True)
    for name in ("ops", "warnings", "reasons", "findings"):
        getattr(first, name).append("x")
        assert getattr(second, name) == [], name
    assert Decision(True) == Decision(True)  # the dataclass's eq, still generated
