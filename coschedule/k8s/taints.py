"""Kubernetes' toleration rules, pure: does a pod (a placeholder) still belong on its node?

A NoExecute toleration with ``tolerationSeconds`` only delays the eviction (the
DefaultTolerationSeconds plugin gives every pod 300 s for not-ready/unreachable); the
group cannot use that node meanwhile, so for us it does not count as tolerating.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from coschedule.k8s.nodes import Node, Taint

REPELLING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.key:
        return False
    if operator == "Exists":
        matched = True
    elif operator == "Equal":
        matched = bool(key) and (toleration.get("value") or "") == taint.value
    else:
        return False  # an unknown operator tolerates nothing (the apiserver would refuse it)
    if matched and taint.effect == "NoExecute" and toleration.get("tolerationSeconds") is not None:
        return False
    return matched


def untolerated(node: Node, tolerations: Iterable[Mapping[str, Any]]) -> list[Taint]:
    """The node's NoSchedule/NoExecute taints that none of the tolerations tolerates."""
    tols = list(tolerations)
    return [
        taint
        for taint in node.taints
        if taint.effect in REPELLING_EFFECTS and not any(tolerates(t, taint) for t in tols)
    ]


def eviction_reason(node: Node, tolerations: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """("cordoned" | "tainted", why) when the pod must leave the node, else ("", "")."""
    if node.unschedulable:
        return "cordoned", f"node {node.name} is cordoned (spec.unschedulable)"
    taints = untolerated(node, tolerations)
    if taints:
        names = ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in taints)
        return (
            "tainted",
            f"node {node.name} has taint(s) the placeholder does not tolerate: {names}",
        )
    return "", ""
