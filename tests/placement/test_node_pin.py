"""The node pin and the placeholder's gate: operations checked by applying them and asking
the scheduler's own rule (k8s/nodeaffinity) which nodes the pod may use afterwards."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coschedule.engines import pod_recreated_by_owner
from coschedule.k8s.constants import REQUIRED
from coschedule.k8s.nodeaffinity import pod_allows, required_terms
from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER
from coschedule.placement import node_pin
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview
from coschedule.wire.pod_fields import MalformedPod

NODES = {
    "node-a": {"kubernetes.io/hostname": "node-a", "disk": "ssd", "zone": "z1"},
    "node-b": {"kubernetes.io/hostname": "node-b", "disk": "ssd", "zone": "z2"},
    "node-c": {"kubernetes.io/hostname": "node-c", "disk": "hdd", "zone": "z1"},
}


def allowed_nodes(pod: dict[str, Any]) -> set[str]:
    spec = pod.get("spec") or {}
    terms = required_terms(spec.get("affinity"))
    selector = spec.get("nodeSelector") or {}
    return {name for name, labels in NODES.items() if pod_allows(selector, terms, labels, name)}


def pod_with(affinity: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "step", "image": "busybox"}], **spec}
    if affinity is not None:
        body["affinity"] = affinity
    return {"metadata": {"name": "p", "annotations": {"coschedule.dev/mode": "x"}}, "spec": body}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}


SSD = {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
Z1 = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}


@pytest.mark.parametrize(
    ("pod", "node", "expected"),
    [
        ({"metadata": {}}, "node-b", {"node-b"}),  # no spec at all
        (pod_with(), "node-b", {"node-b"}),
        (pod_with({}), "node-b", {"node-b"}),
        (pod_with({"podAntiAffinity": {}}), "node-c", {"node-c"}),
        (pod_with({"nodeAffinity": {}}), "node-a", {"node-a"}),
        # The user's own requirement is kept: pinned to a node it refuses, nothing fits.
        (pod_with(required(SSD)), "node-b", {"node-b"}),
        (pod_with(required(SSD)), "node-c", set()),
        # ORed terms: the pin goes into each, so neither lets the pod elsewhere.
        (pod_with(required(SSD, Z1)), "node-c", {"node-c"}),
        (pod_with(required(SSD, Z1)), "node-b", {"node-b"}),
        (pod_with(required(SSD), nodeSelector={"zone": "z2"}), "node-a", set()),
    ],
)
def test_pin_leaves_only_the_node_the_users_rules_allow(
    pod: dict[str, Any], node: str, expected: set[str]
) -> None:
    before = copy.deepcopy(pod)
    pinned = jsonpatch.apply(pod, node_pin.pin_ops(podview.spec(pod), node))
    assert allowed_nodes(pinned) == expected
    assert pod == before  # the operations are built from a view, never by mutating it
    # Reinvoked on its own output: nothing more to do.
    assert node_pin.pin_ops(pinned["spec"], node) == []


def test_pin_keeps_the_users_match_fields_and_replaces_only_our_previous_pin() -> None:
    users = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-c"]}]}
    pod = pod_with(required(users))
    first = jsonpatch.apply(pod, node_pin.pin_ops(pod["spec"], "node-a"))
    assert allowed_nodes(first) == {"node-a"}
    # An earlier admission pinned it to node-a; now the placeholder is on node-b.
    moved = jsonpatch.apply(first, node_pin.pin_ops(first["spec"], "node-b", previous="node-a"))
    assert allowed_nodes(moved) == {"node-b"}
    fields = required_terms(moved["spec"]["affinity"])[0]["matchFields"]  # type: ignore[index]
    assert fields[0] == users["matchFields"][0]
    assert len(fields) == 2
    # Without knowing the earlier pin, a second pin is added, and no node matches both:
    # that is why the annotation records it.
    stacked = jsonpatch.apply(first, node_pin.pin_ops(first["spec"], "node-b"))
    assert allowed_nodes(stacked) == set()


def test_malformed_affinity_is_refused_by_shape() -> None:
    with pytest.raises(MalformedPod):
        node_pin.pin_ops(pod_with({"nodeAffinity": []})["spec"], "node-a")
    with pytest.raises(MalformedPod):
        node_pin.pin_ops(pod_with(required("not a term"))["spec"], "node-a")  # type: ignore[arg-type]


def test_gate_is_added_once_beside_other_gates_and_lifted_alone() -> None:
    other = {"name": "example.com/quota"}
    pods: list[dict[str, Any]] = [pod_with(), pod_with(schedulingGates=[other]), {"metadata": {}}]
    for pod in pods:
        gated = jsonpatch.apply(pod, node_pin.gate_ops(podview.spec(pod)))
        gates = gated["spec"]["schedulingGates"]
        assert {"name": GATE_PLACEHOLDER} in gates
        assert node_pin.gate_ops(gated["spec"]) == []  # idempotent under reinvocation
        lifted = jsonpatch.apply(gated, node_pin.ungate_ops(gated["spec"]))
        assert {"name": GATE_PLACEHOLDER} not in lifted["spec"]["schedulingGates"]
        assert [g for g in gates if g != {"name": GATE_PLACEHOLDER}] == lifted["spec"][
            "schedulingGates"
        ]


def test_ungate_built_from_a_stale_view_fails_instead_of_lifting_another_gate() -> None:
    pod = pod_with(schedulingGates=[{"name": GATE_PLACEHOLDER}, {"name": "example.com/quota"}])
    ops = node_pin.ungate_ops(pod["spec"])
    # Meanwhile someone lifted a gate and ours moved to index 0... of a different list.
    now = pod_with(schedulingGates=[{"name": "example.com/quota"}])
    with pytest.raises(jsonpatch.PatchTestFailed):
        jsonpatch.apply(now, ops)


def test_release_pins_records_and_lifts_in_one_patch() -> None:
    pod = pod_with(required(SSD), schedulingGates=[{"name": GATE_PLACEHOLDER}])
    released = jsonpatch.apply(pod, node_pin.release_ops(pod, "node-b"))
    assert allowed_nodes(released) == {"node-b"}
    assert released["spec"]["schedulingGates"] == []
    assert released["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "node-b"
    assert node_pin.pinned_node(released["metadata"]) == "node-b"
    # Not gated (already released, or never ours): nothing.
    assert node_pin.release_ops(released, "node-a") == []
    assert node_pin.release_ops(pod_with(), "node-a") == []


term_strategy = st.fixed_dictionaries(
    {
        "matchExpressions": st.lists(
            st.fixed_dictionaries(
                {
                    "key": st.sampled_from(["disk", "zone"]),
                    "operator": st.sampled_from(["In", "NotIn"]),
                    "values": st.lists(st.sampled_from(["ssd", "hdd", "z1", "z2"]), min_size=1),
                }
            ),
            max_size=2,
        )
    }
)


@given(st.lists(term_strategy, min_size=1, max_size=3), st.sampled_from(sorted(NODES)))
def test_pinned_pod_may_use_its_node_exactly_when_the_user_allowed_it(
    terms: list[dict[str, Any]], node: str
) -> None:
    pod = pod_with(required(*terms))
    pinned = jsonpatch.apply(pod, node_pin.pin_ops(pod["spec"], node))
    assert allowed_nodes(pinned) == allowed_nodes(pod) & {node}


@pytest.mark.parametrize(
    ("refs", "expected"),
    [
        ([{"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "controller": True}], True),
        ([{"apiVersion": "tekton.dev/v1beta1", "kind": "TaskRun", "controller": True}], True),
        # Argo fails a step whose pod was deleted; the Job controller counts a failure.
        ([{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "controller": True}], False),
        ([{"apiVersion": "batch/v1", "kind": "Job", "controller": True}], False),
        # Only the controller counts, and only of the right API group.
        ([{"apiVersion": "tekton.dev/v1", "kind": "TaskRun"}], False),
        ([{"apiVersion": "example.com/v1", "kind": "TaskRun", "controller": True}], False),
        ([{"apiVersion": "v1", "kind": "TaskRun", "controller": True}], False),
        (None, False),
        ("junk", False),
    ],
)
def test_which_owners_recreate_a_deleted_pod(refs: Any, expected: bool) -> None:
    assert pod_recreated_by_owner(refs) is expected
