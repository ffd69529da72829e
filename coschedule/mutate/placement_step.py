"""How ``decide`` holds a pod beside its placeholder: which placement strategy it gets
(``by_node_name``: placement ``auto`` on a per-node topology key, for pods their owner
recreates), and the operations of each: the pin or the scheduling gate (``node_placement_ops``,
from ``coschedule.placement.node_pin``), or the pod-affinity term (``affinity_ops``, from
``marks.affinity_term``); and the admission policy's gate lifted from a pod this decision does
not hold (``drop_policy_gate``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.engines import pod_recreated_by_owner
from coschedule.k8s.constants import HOSTNAME, REQUIRED
from coschedule.marks import LABEL_GATED_BY
from coschedule.mutate.context import AdmissionContext
from coschedule.mutate.outcome import Decision
from coschedule.placement import node_pin
from coschedule.wire import jsonpatch
from coschedule.wire import pod_fields as podview
from coschedule.wire.jsonpatch import Op

# Our keys are constants: escape their paths once, not on every admission.
_GATED_BY_PATH = jsonpatch.pointer("metadata", "labels", LABEL_GATED_BY)
_REQUIRED_POD_AFFINITY = "/spec/affinity/podAffinity/" + REQUIRED


def by_node_name(meta: Mapping[str, Any], settings: Settings, decision: Decision) -> bool:
    """Placement ``auto``: whether this pod is placed by node name (pinned, or gated until
    its placeholder is bound) instead of by a pod-affinity term. Only where a pod left
    pending on a node its placeholder left can be deleted and come back: its owner
    recreates it (a Tekton TaskRun's pod), and the run is kept on one node."""
    if settings.topology_key != HOSTNAME:
        if decision.trace:
            decision.reasons.append(
                f"placement: pod affinity: the topology key is {settings.topology_key}, and a "
                "node name pins one node, not a domain"
            )
        return False
    if not pod_recreated_by_owner(meta.get("ownerReferences")):
        if decision.trace:
            decision.reasons.append(
                "placement: pod affinity: the pod's controller does not recreate a deleted "
                "pod (only a Tekton TaskRun does), so a pin that its run leaves could strand it"
            )
        return False
    return True


def node_placement_ops(
    pod_spec: Mapping[str, Any],
    meta: Mapping[str, Any],
    placeholder: str,
    previous: str | None,
    ctx: AdmissionContext,
    ops: list[Op],
    decision: Decision,
) -> str | None:
    """Pin the pod to its placeholder's node when the webhook knows it, else hold it behind
    the placeholder's gate for the reconciler to pin; return the node pinned (None: gated).
    Reinvoked on its own output it adds nothing: a gated pod stays gated (the reconciler
    pins it), a pinned one stays pinned unless the placeholder has moved since."""
    trace = decision.trace
    decision.by_node_name = True
    # Most pods (a TaskRun's pod as Tekton makes it) have no affinity and no gate: each step
    # below that reads one is skipped by a dict lookup (the same answer: an absent or null
    # field is what those steps skip), as a call per step is what this path costs under load.
    if pod_spec.get("affinity") is not None:
        _drop_placeholder_terms(pod_spec, placeholder, previous, ops, decision)
    view = ctx.placeholders
    node = view.node(ctx.namespace, placeholder) if view is not None else None
    gates = pod_spec.get("schedulingGates")
    gated = gates is not None and node_pin.gate_index(pod_spec) is not None
    if gated and node is not None and previous is None:
        # Gated by the admission policy, not by an earlier admission of ours (which, on
        # reinvocation, stays as it decided), and the placeholder is bound: pin it and lift
        # the gate, as the reconciler would.
        ops.extend(node_pin.pin_ops(pod_spec, node, node_pin.pinned_node(meta)))
        ops.extend(node_pin.ungate_ops(pod_spec))
        if trace:
            decision.reasons.append(
                f"placement: by node name: the placeholder's pod is bound to {node!r}: pinned "
                f"to it, and the {marks.GATE_PLACEHOLDER} gate lifted"
            )
        return node
    # Held behind the gate: gated now, or left gated on a reinvocation. A pod pinned below
    # is not (the unmarked-pod controller reads this).
    decision.held = gated or node is None
    # Not on a reinvocation (the pod carries our earlier decision), nor without a view.
    decision.unbound = node is None and previous is None and view is not None
    if gated:
        if trace:
            decision.reasons.append(
                f"placement: by node name: already held behind the {marks.GATE_PLACEHOLDER} "
                "gate; the reconciler pins it once the placeholder is bound"
            )
        return None
    if node is None:
        if gates is None and pod_spec:
            ops.append(jsonpatch.add("/spec/schedulingGates", [node_pin.gate()]))
        else:
            ops.extend(node_pin.gate_ops(pod_spec))
        if trace:
            pinned = node_pin.pinned_node(meta)
            why = "not known" if view is None else "not bound yet"
            decision.reasons.append(
                f"placement: by node name: the placeholder's node is {why}: held behind the "
                f"{marks.GATE_PLACEHOLDER} scheduling gate until the reconciler pins it there"
                + (f" (replacing the pin to {pinned!r})" if pinned else "")
            )
        return None
    pinned = node_pin.pinned_node(meta)
    ops.extend(node_pin.pin_ops(pod_spec, node, pinned))
    if trace:
        if pinned == node:
            what = "already pinned to it"
        elif pinned:
            what = f"pinned to it (was {pinned!r}, which the placeholder left)"
        else:
            what = "pinned to it (spec.affinity.nodeAffinity matchFields metadata.name)"
        decision.reasons.append(
            f"placement: by node name: the placeholder's pod is bound to {node!r}: {what}"
        )
    return node


def _drop_placeholder_terms(
    pod_spec: Mapping[str, Any],
    placeholder: str,
    previous: str | None,
    ops: list[Op],
    decision: Decision,
) -> None:
    """Placed by node name, the pod carries no pod-affinity term of ours: one an earlier
    admission added (under ``pod-affinity``) is removed; another assistant's is warned of."""
    if not pod_spec:
        return
    affinity = podview.sub_object(pod_spec, "affinity", "pod.spec")
    pod_affinity = (
        podview.sub_object(affinity, "podAffinity", "pod.spec.affinity") if affinity else None
    )
    if not pod_affinity:
        return
    terms = podview.sub_list(pod_affinity, REQUIRED, "pod.spec.affinity.podAffinity")
    if not terms:
        return
    ours, _ = _placeholder_terms(terms, placeholder, previous, None, decision)
    for index in reversed(ours):
        ops.append(jsonpatch.remove(f"{_REQUIRED_POD_AFFINITY}/{index}"))
    if ours and decision.trace:
        decision.reasons.append(f"affinity: removed {len(ours)} placeholder term(s) of ours")


def _placeholder_terms(
    terms: list[Any],
    placeholder: str,
    previous: str | None,
    topology_key: str | None,
    decision: Decision,
) -> tuple[list[int], bool]:
    """(indexes of our terms to remove, whether the wanted term is there): a term to the
    placeholder with ``topology_key`` is wanted (none when None); one to it with another
    key or to ``previous`` is ours from an earlier admission. A term to another placeholder
    (Tekton's own Affinity Assistant) gets a warning."""
    present = False
    stale: list[int] = []
    for index, existing in enumerate(terms):
        instance = marks.term_placeholder(existing)
        if instance is None:
            continue
        if instance == placeholder and (
            topology_key is None or existing.get("topologyKey") == topology_key
        ):
            if topology_key is None:
                stale.append(index)
            else:
                present = True
        elif previous is not None and instance == previous:
            # Ours from an earlier admission under another decision (reinvocation after
            # another webhook changed the pod): it would pin the pod twice.
            stale.append(index)
        elif instance != placeholder:
            decision.warnings.append(
                f"pod already has an affinity-assistant term to {instance!r}: is Tekton's own "
                "Affinity Assistant also on? Set coschedule: disabled in Tekton's feature-flags "
                "so that only one of them pins this run"
            )
    return stale, present


def affinity_ops(
    pod_spec: Mapping[str, Any],
    placeholder: str,
    previous: str | None,
    topology_key: str,
    ops: list[Op],
    decision: Decision,
) -> None:
    """Append the placeholder term to the pod's own affinity, creating only what is absent."""
    term = marks.affinity_term(placeholder, topology_key)
    if not pod_spec:
        ops.append(jsonpatch.add("/spec", {"affinity": {"podAffinity": {REQUIRED: [term]}}}))
        if decision.trace:
            decision.reasons.append("affinity: created spec.affinity with the placeholder term")
        return
    affinity = podview.sub_object(pod_spec, "affinity", "pod.spec")
    if affinity is None:
        ops.append(jsonpatch.add("/spec/affinity", {"podAffinity": {REQUIRED: [term]}}))
        if decision.trace:
            decision.reasons.append("affinity: created spec.affinity with the placeholder term")
        return
    pod_affinity = podview.sub_object(affinity, "podAffinity", "pod.spec.affinity")
    if pod_affinity is None:
        ops.append(jsonpatch.add("/spec/affinity/podAffinity", {REQUIRED: [term]}))
        if decision.trace:
            decision.reasons.append(
                "affinity: added podAffinity; the pod's node affinity and anti-affinity are kept"
            )
        return
    terms = podview.sub_list(pod_affinity, REQUIRED, "pod.spec.affinity.podAffinity")
    base = _REQUIRED_POD_AFFINITY
    if terms is None:
        ops.append(jsonpatch.add(base, [term]))
        if decision.trace:
            decision.reasons.append("affinity: added a required podAffinity list to the pod's own")
        return

    stale, present = _placeholder_terms(terms, placeholder, previous, topology_key, decision)
    for index in reversed(stale):
        ops.append(jsonpatch.remove(f"{base}/{index}"))
        if decision.trace:
            decision.reasons.append(f"affinity: removed the stale term to {previous!r}")
    if present:
        if decision.trace:
            decision.reasons.append("affinity: the placeholder term is already there")
    else:
        ops.append(jsonpatch.add(base + "/-", term))
        if decision.trace:
            decision.reasons.append(
                f"affinity: appended the placeholder term to {len(terms) - len(stale)} existing "
                "required podAffinity term(s)"
            )


def drop_policy_gate(pod: Mapping[str, Any], decision: Decision) -> None:
    """The admission policy gates every pod that may be placed by node name (CEL cannot tell
    which are); one this decision does not hold gets the gate lifted again here."""
    ops = node_pin.ungate_ops(podview.spec(pod))
    if ops:  # the policy's label goes with its gate: it marks a pod no one has decided on
        ops.append(jsonpatch.remove(_GATED_BY_PATH))
    decision.ops.extend(ops)
    if ops and decision.trace:
        decision.reasons.append(
            f"gate: the admission policy's {marks.GATE_PLACEHOLDER} gate lifted: "
            "this pod is not held for the reconciler"
        )
