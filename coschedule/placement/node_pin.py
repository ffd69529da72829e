"""Placement by node name: the JSONPatch operations that pin a pod to its placeholder's node,
and that hold it behind (or release it from) the placeholder's scheduling gate.

The scheduler evaluates a pod pinned by ``matchFields metadata.name`` against one node; a
required pod-affinity term makes it walk every pod of the cluster (issue 20's figures). The
webhook pins a pod whose placeholder is already bound, and gates the others; the reconciler
pins and lifts the gate in one patch once the placeholder is bound. Both build the
operations here, so the pin is spelled once.

The pin is ANDed into every required node-selector term (terms are ORed: a term without it
would let the pod go elsewhere); the user's own expressions are kept. While a pod is gated,
kube-apiserver accepts exactly this change to its node affinity (adding requirements to
existing terms, or setting it when absent), so the reconciler's patch is always admissible.
Pure: plain data in, operations out. Raises ``MalformedPod`` on shapes the API would refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule.k8s.constants import REQUIRED
from coschedule.k8s.nodeaffinity import NAME_FIELD
from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview
from coschedule.wire.jsonpatch import Op

_TERMS = "nodeSelectorTerms"
_NODE_AFFINITY = "/spec/affinity/nodeAffinity"
_PINNED_NODE_PATH = jsonpatch.pointer("metadata", "annotations", ANNOTATION_PINNED_NODE)
_GATE = {"name": GATE_PLACEHOLDER}


def pin_requirement(node: str) -> dict[str, Any]:
    """The requirement that holds a pod to one node, by name."""
    return {"key": NAME_FIELD, "operator": "In", "values": [node]}


def _is_pin(requirement: Any, node: str | None) -> bool:
    """A ``metadata.name In [node]`` requirement (any node when ``node`` is None)."""
    if not isinstance(requirement, Mapping):
        return False
    if requirement.get("key") != NAME_FIELD or requirement.get("operator") != "In":
        return False
    values = requirement.get("values")
    if not isinstance(values, list) or len(values) != 1:
        return False
    return node is None or values[0] == node


def pinned_node(metadata: Mapping[str, Any]) -> str | None:
    """The node our pin names (the annotation), or None: not pinned by us."""
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping):
        return None
    node = annotations.get(ANNOTATION_PINNED_NODE)
    return node if isinstance(node, str) and node else None


def pin_ops(pod_spec: Mapping[str, Any], node: str, previous: str | None = None) -> list[Op]:
    """Operations that pin the pod to ``node`` (none when it already is).

    ``previous``: the node an earlier admission pinned it to (the annotation); that pin is
    replaced, never stacked (two pins to two nodes match no node).
    """
    wanted = pin_requirement(node)
    if not pod_spec:
        return [jsonpatch.add("/spec", {"affinity": _node_affinity(wanted)})]
    affinity = podview.sub_object(pod_spec, "affinity", "pod.spec")
    if affinity is None:
        return [jsonpatch.add("/spec/affinity", _node_affinity(wanted))]
    node_affinity = podview.sub_object(affinity, "nodeAffinity", "pod.spec.affinity")
    if node_affinity is None:
        return [jsonpatch.add(_NODE_AFFINITY, _node_affinity(wanted)["nodeAffinity"])]
    where = "pod.spec.affinity.nodeAffinity"
    required = podview.sub_object(node_affinity, REQUIRED, where)
    if required is None:
        only = {_TERMS: [{"matchFields": [wanted]}]}
        return [jsonpatch.add(f"{_NODE_AFFINITY}/{REQUIRED}", only)]
    terms = podview.sub_list(required, _TERMS, f"{where}.{REQUIRED}")
    if not terms:
        # The API requires at least one term; an absent list is "no requirement".
        return [jsonpatch.add(f"{_NODE_AFFINITY}/{REQUIRED}/{_TERMS}", [{"matchFields": [wanted]}])]
    ops: list[Op] = []
    for index, term in enumerate(terms):
        base = f"{_NODE_AFFINITY}/{REQUIRED}/{_TERMS}/{index}"
        if not isinstance(term, Mapping):
            raise podview.MalformedPod(f"{where}.{REQUIRED}.{_TERMS}[{index}] must be an object")
        fields = podview.sub_list(term, "matchFields", f"{where}.{REQUIRED}.{_TERMS}[{index}]")
        if not fields and not term.get("matchExpressions"):
            continue  # an empty term matches no node; pinned, it would match ours
        if fields is None:
            ops.append(jsonpatch.add(f"{base}/matchFields", [wanted]))
            continue
        if any(_is_pin(f, node) for f in fields):
            continue
        stale = [i for i, f in enumerate(fields) if previous is not None and _is_pin(f, previous)]
        if stale:
            ops.append(jsonpatch.replace(f"{base}/matchFields/{stale[0]}", wanted))
        else:
            ops.append(jsonpatch.add(f"{base}/matchFields/-", wanted))
    return ops


def _node_affinity(requirement: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {REQUIRED: {_TERMS: [{"matchFields": [requirement]}]}}}


def pinned_node_op(metadata: Mapping[str, Any], node: str) -> list[Op]:
    """Record the pin in the annotation (the pod's annotations exist: it carries our marks)."""
    annotations = metadata.get("annotations")
    if isinstance(annotations, Mapping) and annotations.get(ANNOTATION_PINNED_NODE) == node:
        return []
    if not isinstance(annotations, Mapping):
        return [jsonpatch.add("/metadata/annotations", {ANNOTATION_PINNED_NODE: node})]
    return [jsonpatch.add(_PINNED_NODE_PATH, node)]


def gate_index(pod_spec: Mapping[str, Any]) -> int | None:
    """Where the placeholder's gate is in ``spec.schedulingGates``, or None."""
    gates = podview.sub_list(pod_spec, "schedulingGates", "pod.spec") if pod_spec else None
    for index, gate in enumerate(gates or ()):
        if isinstance(gate, Mapping) and gate.get("name") == GATE_PLACEHOLDER:
            return index
    return None


def gate() -> dict[str, str]:
    """The placeholder's scheduling gate, a fresh object (an operation's value is the
    caller's)."""
    return dict(_GATE)


def gate_ops(pod_spec: Mapping[str, Any]) -> list[Op]:
    """Hold the pod behind the placeholder's gate (none when it already is)."""
    if not pod_spec:
        return [jsonpatch.add("/spec", {"schedulingGates": [gate()]})]
    if gate_index(pod_spec) is not None:
        return []
    if pod_spec.get("schedulingGates") is None:
        return [jsonpatch.add("/spec/schedulingGates", [gate()])]
    return [jsonpatch.add("/spec/schedulingGates/-", gate())]


def ungate_ops(pod_spec: Mapping[str, Any]) -> list[Op]:
    """Lift the placeholder's gate; a ``test`` first, so that a patch built from a stale view
    of the gates fails (422) instead of removing someone else's gate."""
    index = gate_index(pod_spec)
    if index is None:
        return []
    path = f"/spec/schedulingGates/{index}"
    return [jsonpatch.test(path, dict(_GATE)), jsonpatch.remove(path)]


def release_ops(pod: Mapping[str, Any], node: str) -> list[Op]:
    """The reconciler's one patch for a gated pod whose placeholder is bound to ``node``:
    pin, record the pin, lift the gate. Empty when the pod is not gated by us."""
    pod_spec = podview.spec(pod)
    if gate_index(pod_spec) is None:
        return []
    meta = podview.metadata(pod)
    return [
        *pin_ops(pod_spec, node, pinned_node(meta)),
        *pinned_node_op(meta, node),
        *ungate_ops(pod_spec),
    ]
