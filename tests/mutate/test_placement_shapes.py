"""Placement by node name over every shape of the fields it reads, as the hot path reads them.

``placement_step.node_placement_ops`` skips its affinity and gate steps by a dict lookup when
the pod has no ``spec.affinity`` or no ``spec.schedulingGates`` (most pods: a TaskRun's pod as
Tekton makes it), and reads the pin annotation only where it is used. These cases hold that
path to what the steps decide: absent and null are the same pod, ``explain`` changes nothing
but the sentences, the patched pod has exactly the gate or pin it should and no placeholder
term of ours, a second admission adds nothing, and a malformed field is still refused."""

from __future__ import annotations

import copy
import itertools
from dataclasses import asdict
from typing import Any

import jsonpatch as reference_jsonpatch
import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.constants import REQUIRED
from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER, Mode, affinity_term
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.placement.node_pin import pin_requirement, pinned_node
from coschedule.wire.pod_fields import MalformedPod
from tests.fixtures import load_pod

TEKTON = ("tekton-taskrun", "tekton-taskrun-two-workspaces", "tekton-taskrun-no-workspace")
ABSENT = object()


class Placeholders:
    def __init__(self, node: str | None) -> None:
        self.bound = node

    def node(self, namespace: str, placeholder: str) -> str | None:
        return self.bound


def _placeholder(pod: dict[str, Any]) -> str:
    found = decide(pod, _context(None, explain=False)).placeholder
    assert found is not None
    return found


def _context(view: Placeholders | None, *, explain: bool) -> AdmissionContext:
    settings = Settings(mode=Mode.PIPELINERUNS, mode_reason="test")
    return AdmissionContext(settings, "ci", placeholders=view, explain=explain)


def _affinities(placeholder: str) -> dict[str, Any]:
    ours = affinity_term(placeholder, "kubernetes.io/hostname")
    other = affinity_term("affinity-assistant-0123456789", "kubernetes.io/hostname")
    pin = {"nodeSelectorTerms": [{"matchFields": [pin_requirement("node-a")]}]}
    return {
        "absent": ABSENT,
        "null": None,
        "empty": {},
        "our term": {"podAffinity": {REQUIRED: [ours]}},
        "our term and another": {"podAffinity": {REQUIRED: [other, ours]}},
        "pinned to node-a": {"nodeAffinity": {REQUIRED: pin}},
    }


GATES: dict[str, Any] = {
    "absent": ABSENT,
    "null": None,
    "empty": [],
    "another": [{"name": "example.com/quota"}],
    "ours": [{"name": GATE_PLACEHOLDER}],
    "another and ours": [{"name": "example.com/quota"}, {"name": GATE_PLACEHOLDER}],
}
PINS: dict[str, Any] = {"absent": ABSENT, "node-a": "node-a", "node-b": "node-b"}
VIEWS: dict[str, Placeholders | None] = {
    "no view": None,
    "not bound": Placeholders(None),
    "bound to node-a": Placeholders("node-a"),
    "bound to node-b": Placeholders("node-b"),
}


def _set(obj: dict[str, Any], key: str, value: Any) -> None:
    if value is ABSENT:
        obj.pop(key, None)
    else:
        obj[key] = copy.deepcopy(value)


def shapes() -> list[tuple[str, dict[str, Any]]]:
    """(name, pod) for every Tekton fixture, affinity, gates and pin annotation."""
    out = []
    for fixture in TEKTON:
        base = load_pod(fixture)
        base["metadata"].setdefault("annotations", {})
        placeholder = _placeholder(base)
        for (a, affinity), (g, gates), (p, pin) in itertools.product(
            _affinities(placeholder).items(), GATES.items(), PINS.items()
        ):
            pod = copy.deepcopy(base)
            _set(pod["spec"], "affinity", affinity)
            _set(pod["spec"], "schedulingGates", gates)
            _set(pod["metadata"]["annotations"], ANNOTATION_PINNED_NODE, pin)
            out.append((f"{fixture}, affinity {a}, gates {g}, pin {p}", pod))
    return out


SHAPES = shapes()


def _outcome(decision: Decision) -> dict[str, Any]:
    fields = asdict(decision)
    del fields["reasons"], fields["trace"]
    return fields


def _ours(patched: dict[str, Any], placeholder: str) -> list[Any]:
    terms = ((patched["spec"].get("affinity") or {}).get("podAffinity") or {}).get(REQUIRED) or []
    return [t for t in terms if t == affinity_term(placeholder, "kubernetes.io/hostname")]


def _gates(patched: dict[str, Any]) -> list[Any]:
    return [
        g for g in patched["spec"].get("schedulingGates") or [] if g["name"] == GATE_PLACEHOLDER
    ]


@pytest.mark.parametrize("view_name", list(VIEWS))
def test_placement_by_node_name_over_every_shape(view_name: str) -> None:
    view = VIEWS[view_name]
    node = view.bound if view is not None else None
    for name, pod in SHAPES:
        case = f"{name}, {view_name}"
        quick = decide(pod, _context(view, explain=False))
        traced = decide(pod, _context(view, explain=True))
        assert _outcome(quick) == _outcome(traced), case  # explain changes only the sentences
        assert quick.allowed, case
        assert quick.by_node_name, case
        placeholder = quick.placeholder
        assert placeholder is not None, case
        patched = reference_jsonpatch.apply_patch(pod, quick.ops)
        assert _ours(patched, placeholder) == [], case  # no pod-affinity term of ours left
        # Pinned: the pin annotation names the node, and the pod is no longer held back by
        # our gate unless an earlier admission of ours gated it (it stays as it decided).
        if pinned_node(patched["metadata"]) is None or node is None:
            assert len(_gates(patched)) == 1, case  # held: exactly one gate of ours
        else:
            assert pinned_node(patched["metadata"]) == node, case
            assert len(_gates(patched)) <= 1, case
        again = decide(patched, _context(view, explain=False))
        assert again.ops == [], (case, again.ops)  # reinvoked: nothing more to add


@pytest.mark.parametrize("field", ["affinity", "schedulingGates"])
def test_absent_and_null_are_the_same_pod(field: str) -> None:
    for fixture in TEKTON:
        absent = load_pod(fixture)
        absent["spec"].pop(field, None)
        null = copy.deepcopy(absent)
        null["spec"][field] = None
        for view_name, view in VIEWS.items():
            for explain in (False, True):
                ctx = _context(view, explain=explain)
                first, second = decide(absent, ctx), decide(null, ctx)
                assert asdict(first) == asdict(second), (fixture, field, view_name)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("affinity", "not an object", "pod.spec.affinity must be an object"),
        (
            "schedulingGates",
            {"name": GATE_PLACEHOLDER},
            "pod.spec.schedulingGates must be an array",
        ),
    ],
)
def test_a_malformed_field_is_still_refused(field: str, value: Any, message: str) -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"][field] = value
    for view in VIEWS.values():
        with pytest.raises(MalformedPod, match=message):
            decide(pod, _context(view, explain=False))
