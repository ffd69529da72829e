"""Pods placed by node name, planned: ``plan_pins(observed, earlier) -> Plan``. Pure.

With ``placement: auto`` the webhook ties a run's pod to its placeholder by node name: it
pins the pod to the node the placeholder pod is bound to, or, before that, holds it behind
the placeholder's scheduling gate. Here the reconciler finishes the protocol:

- **release**: a pod held by our gate whose placeholder pod is bound (and staying) gets one
  JSON patch that pins it to that node, records the pin and lifts the gate;
- **stranded**: a pod pinned by us to node P that never started (unbound, not gated, not
  being deleted) while its run's placeholder is on another node M, or is leaving P, can
  never follow (a pod's node affinity is immutable once it is not gated). When its
  controller recreates a deleted never-started pod (``engines.pod_recreated_by_owner``:
  Tekton's TaskRun does), it is deleted, conditionally on the uid and resourceVersion seen,
  so a pod that got bound meanwhile is never deleted; the engine's new pod is pinned to M
  (or gated until the placeholder is bound). One Event on the run says so.

``earlier`` are the actions already planned for the group in this pass (placeholder
evictions, relocation, strays): a placeholder pod they delete is leaving its node, so no pod
is released onto it, and a pod pinned there is stranded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from coschedule.k8s.constants import HOSTNAME
from coschedule.marks import GATE_PLACEHOLDER
from coschedule.placement import node_pin
from coschedule.reconcile import relocation
from coschedule.reconcile.model import (
    Action,
    DeletePlaceholderPod,
    DeleteStrandedPod,
    DeleteStrayPod,
    MarkedPod,
    Observed,
    OwnerRef,
    Plan,
    RecordEvent,
    ReleasePod,
    RelocatePlaceholder,
)

REASON_STRANDED = "PodRecreated"


def stranded_first(earlier: Plan, pins: Plan) -> Plan:
    """``earlier`` then ``pins``, but the stranded pods deleted first, then the releases.
    A placeholder pod that leaves its node frees room there: a pod pinned to that node and
    stuck for want of room would be bound into it before its own delete came, and the run
    split across two nodes. Deleted first (conditionally: the executor ends the pass if one
    was bound meanwhile), it cannot be. Pure."""
    both = earlier.then(pins)
    stranded = tuple(a for a in both.actions if isinstance(a, DeleteStrandedPod))
    # A release onto the bound placeholder's node comes before the StatefulSet's drift
    # patch: that patch is conditional on the version seen, and a 409 (the StatefulSet
    # controller writing its status meanwhile) ends the pass; the run's first pod, often
    # the one being released, must not wait for the retry's backoff.
    releases = tuple(a for a in both.actions if isinstance(a, ReleasePod))
    others = tuple(a for a in both.actions if not isinstance(a, DeleteStrandedPod | ReleasePod))
    return replace(both, actions=(*stranded, *releases, *others))


def plan_pins(observed: Observed, earlier: Sequence[Action] = ()) -> Plan:
    """Release the gated pods onto the placeholder's node; delete pinned pods stranded on a
    node the run left. Pure."""
    leaving = _leaving(observed, earlier)
    staying = sorted(
        {
            p.node_name
            for p in observed.placeholder_pods
            if p.node_name and not p.deleting and p.name not in leaving
        }
    )
    # One placeholder pod per run; two bound (a stray being deleted) decide nothing.
    node = staying[0] if len(staying) == 1 else None
    left = _left_nodes(observed, leaving)
    actions: list[Action] = []
    # Oldest first: the release stage ranks a run's releases in this order, so each run's
    # first pod (its first task's) goes out before any run's later ones.
    for pod in sorted(observed.pods, key=lambda p: (p.created, p.name)):
        if not pod.live or pod.deleting or pod.node_name:
            continue
        if pod.gated is not None:
            if node is not None and pod.pinned_node not in (None, node):
                # Gated and pinned to another node (admitted pinned, then gated again): a
                # gate lets requirements be added, not changed, so the pin stays. It can
                # only be made again.
                if pod.recreated:
                    actions.append(_stranded(observed, pod, pod.pinned_node, node))
                continue
            if node is not None:
                ops = node_pin.release_ops(pod.gated, node)
                if ops:
                    actions.append(
                        ReleasePod(
                            pod.namespace,
                            pod.name,
                            observed.name,
                            node,
                            tuple(ops),
                            pod.resource_version,
                        )
                    )
            continue
        pinned = pod.pinned_node
        if pinned is None or not pod.recreated or pinned == node:
            continue
        if node is not None or pinned in left:
            actions.append(_stranded(observed, pod, pinned, node))
    return Plan(tuple(actions))


def _leaving(observed: Observed, earlier: Sequence[Action]) -> set[str]:
    """Placeholder pods this pass deletes (evicted, relocated, strays)."""
    names: set[str] = set()
    for action in earlier:
        if isinstance(action, DeletePlaceholderPod | DeleteStrayPod):
            names.add(action.name)
        elif isinstance(action, RelocatePlaceholder):
            names.update(action.pods)
    return names


def _left_nodes(observed: Observed, leaving: set[str]) -> set[str]:
    """Nodes the run's placeholder is leaving or has left: where a placeholder pod is
    deleted (now or in this pass), and the hostnames a relocation left behind."""
    nodes = {
        p.node_name
        for p in observed.placeholder_pods
        if p.node_name and (p.deleting or p.name in leaving)
    }
    sts = observed.statefulset
    state = relocation.parse(sts.annotations) if sts is not None else None
    if state is not None and state.topology_key == HOSTNAME:
        nodes.update(state.left)
    return nodes


def _stranded(observed: Observed, pod: MarkedPod, pinned: str, node: str | None) -> Action:
    owner = pod.owner
    engine = f"its {owner.kind} {owner.name}" if owner is not None else "its controller"
    if node is not None:
        message = (
            f"pod {pod.name} was pending on node {pinned}, which its run left for node {node}; "
            f"deleted for {engine} to recreate it there"
        )
    else:
        # The run's next node is not known yet (its placeholder pod is being replaced): the
        # Event says what will happen, not a node it cannot name.
        message = (
            f"pod {pod.name} was pending on node {pinned}, which its run is leaving; deleted "
            f"for {engine} to recreate it, pinned to the node the run's placeholder is bound "
            f"to next (held behind the {GATE_PLACEHOLDER} scheduling gate until it is)"
        )
    run: OwnerRef | None = observed.owner.root if observed.owner is not None else None
    event = RecordEvent(
        observed.namespace,
        observed.name,
        REASON_STRANDED,
        message,
        involved=run if run is not None else owner,
    )
    return DeleteStrandedPod(
        pod.namespace,
        pod.name,
        pod.uid,
        pod.resource_version,
        observed.name,
        pinned,
        event,
    )
