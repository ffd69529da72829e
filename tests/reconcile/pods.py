"""Marked pods as the webhook leaves them: fixture pods through the real admission path.

``coschedule.mutate.decision.decide`` + ``coschedule.wire.jsonpatch.apply`` on the realistic
fixtures, then what the apiserver adds after admission (uid, creationTimestamp, status).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from coschedule.config.settings import Settings
from coschedule.marks import LABEL_ENABLED, BadMark, Mode, NamespaceInfo, Placement
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.placement import node_pin
from coschedule.reconcile import shapes
from coschedule.reconcile.model import MarkedPod
from coschedule.wire.jsonpatch import apply
from tests.fixtures import load_pod


def marked_pod(
    fixture: str,
    mode: Mode = Mode.PIPELINERUNS,
    *,
    name: str | None = None,
    created: str = "2026-11-21T06:00:00Z",
    phase: str = "Running",
    node: str = "",
    finished_at: str | None = None,
    settings: Settings | None = None,
    namespace_labels: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    before: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``before`` changes the pod as its engine made it, before admission."""
    pod = load_pod(fixture)
    if labels:
        pod["metadata"].setdefault("labels", {}).update(labels)
    if before is not None:
        before(pod)
    namespace = pod["metadata"].get("namespace") or "default"
    # The pod-affinity encoding unless ``settings`` say otherwise: most reconciler tests
    # are about the group, not how its pods are tied (``by_node_name`` for that).
    config = settings or Settings(mode=mode, placement=Placement.POD_AFFINITY)
    info = None
    if namespace_labels is not None:
        info = NamespaceInfo({LABEL_ENABLED: "true", **namespace_labels})
    decision = decide(pod, AdmissionContext(config, namespace, info))
    assert decision.allowed, decision.reasons
    assert decision.placeholder, decision.reasons
    result: dict[str, Any] = apply(pod, decision.ops)
    meta = result["metadata"]
    meta["name"] = name or meta.get("name") or f"{meta.get('generateName', 'pod-')}x1"
    meta["uid"] = f"uid-{meta['name']}"
    meta["resourceVersion"] = "100"
    meta["creationTimestamp"] = created
    if node:
        result["spec"]["nodeName"] = node
    result["status"] = {"phase": phase}
    if finished_at:
        result["status"]["containerStatuses"] = [
            {"name": "step", "state": {"terminated": {"exitCode": 0, "finishedAt": finished_at}}}
        ]
    return result


def parsed(pod: dict[str, Any]) -> MarkedPod:
    result = shapes.parse_marked(shapes.slim_marked_pod(copy.deepcopy(pod)))
    assert not isinstance(result, BadMark), result
    return result


def placeholder_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"]["coschedule.dev/placeholder"])


def unschedulable(message: str, since: float) -> dict[str, Any]:
    """The PodScheduled condition kube-scheduler writes on a pod it cannot place."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def by_node_name(pod: dict[str, Any], node: str | None = None) -> dict[str, Any]:
    """``pod`` as the webhook leaves it with ``placement: auto``: no pod-affinity term to
    the placeholder; pinned to ``node`` (with the pinned-node mark) when its placeholder is
    bound there, else held behind the placeholder's scheduling gate."""
    pod = copy.deepcopy(pod)
    spec = pod["spec"]
    affinity = spec.get("affinity") or {}
    affinity.pop("podAffinity", None)
    if affinity:
        spec["affinity"] = affinity
    else:
        spec.pop("affinity", None)
    if node is None:
        ops = node_pin.gate_ops(spec)
    else:
        ops = [*node_pin.pin_ops(spec, node), *node_pin.pinned_node_op(pod["metadata"], node)]
    result: dict[str, Any] = apply(pod, ops)
    return result


def condition(reason: str, message: str, since: float) -> dict[str, Any]:
    """A PodScheduled=False condition (reason ``SchedulingGated`` while a gate holds it)."""
    return {**unschedulable(message, since), "reason": reason}
