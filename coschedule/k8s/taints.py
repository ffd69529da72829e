"""Kubernetes' toleration rules, pure: does a pod (a placeholder) still belong on its node?

A NoExecute toleration with ``tolerationSeconds`` only delays the eviction (the
DefaultTolerationSeconds plugin gives every pod 300 s for not-ready/unreachable); the
group cannot use that node meanwhile, so for us it does not count as tolerating.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from coschedule.k8s.nodes import NOT_READY_TAINT, UNREACHABLE_TAINT, Node, Taint

REPELLING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# The node lifecycle controller's taints for a node whose kubelet stopped reporting or says
# NotReady. On a node whose kubelet reports Ready again they are on their way out (lifted on
# the controller's next pass): no reason to move, or a kube-apiserver restart, which leaves
# every node Unknown until its kubelet posts again, would split runs whose task runs there.
LIFECYCLE_TAINTS = frozenset({UNREACHABLE_TAINT, NOT_READY_TAINT})


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
    """("cordoned" | "tainted", why) when the pod must leave the node, else ("", ""). The
    lifecycle taints left on a node that reports Ready again do not count."""
    if node.unschedulable:
        return "cordoned", f"node {node.name} is cordoned (spec.unschedulable)"
    taints = [
        t
        for t in untolerated(node, tolerations)
        if not (node.ready == "True" and t.key in LIFECYCLE_TAINTS)
    ]
    if taints:
        names = ", ".join(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}" for t in taints)
        return (
            "tainted",
            f"node {node.name} has taint(s) the placeholder does not tolerate: {names}",
        )
    return "", ""


# ---- the taints two pods both tolerate -----------------------------------------------

MAX_TOLERATIONS = 64  # kept of a meet; fewer tolerations only narrow where a pod may go


def _norm(toleration: Mapping[str, Any]) -> tuple[str, str, str, str, int | None] | None:
    """(key, operator, value, effect, seconds); None for one that tolerates nothing."""
    key = str(toleration.get("key") or "")
    operator = str(toleration.get("operator") or "Equal")
    if operator not in ("Equal", "Exists") or (operator == "Equal" and not key):
        return None
    value = str(toleration.get("value") or "") if operator == "Equal" else ""
    seconds = toleration.get("tolerationSeconds")
    return (
        key,
        operator,
        value,
        str(toleration.get("effect") or ""),
        seconds if isinstance(seconds, int) and not isinstance(seconds, bool) else None,
    )


def _covers(
    t: tuple[str, str, str, str, int | None], u: tuple[str, str, str, str, int | None]
) -> bool:
    """Every taint ``u`` tolerates, ``t`` tolerates (at least as long)."""
    key, operator, value, effect, seconds = t
    if key and key != u[0]:
        return False
    if operator == "Equal" and (u[1] != "Equal" or u[2] != value):
        return False
    if effect and effect != u[3]:
        return False
    return seconds is None or (u[4] is not None and u[4] <= seconds)


def _meet_one(
    t: tuple[str, str, str, str, int | None], u: tuple[str, str, str, str, int | None]
) -> dict[str, Any] | None:
    """The toleration of exactly the taints both tolerate; None: no taint."""
    if t[0] and u[0] and t[0] != u[0]:
        return None
    if t[3] and u[3] and t[3] != u[3]:
        return None
    if t[1] == "Equal" and u[1] == "Equal" and t[2] != u[2]:
        return None
    equal = t if t[1] == "Equal" else u if u[1] == "Equal" else None
    result: dict[str, Any] = {"key": t[0] or u[0]} if (t[0] or u[0]) else {}
    result["operator"] = "Equal" if equal is not None else "Exists"
    if equal is not None:
        result["value"] = equal[2]
    if t[3] or u[3]:
        result["effect"] = t[3] or u[3]
    limits = [s for s in (t[4], u[4]) if s is not None]
    if limits:
        result["tolerationSeconds"] = min(limits)
    return result


def meet_tolerations(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
) -> tuple[Mapping[str, Any], ...]:
    """Tolerations of exactly the taints both lists tolerate (a placeholder with them goes
    only to nodes both pods tolerate). Each pair's meet, without the ones another covers;
    a toleration one list already has is kept as written."""
    if list(a) == list(b):
        return tuple(a)
    left = [(t, n) for t in a if (n := _norm(t)) is not None]
    right = [(u, n) for u in b if (n := _norm(u)) is not None]
    found: list[tuple[Mapping[str, Any], tuple[str, str, str, str, int | None]]] = []
    for t, tn in left:
        for u, un in right:
            if _covers(un, tn):
                met: Mapping[str, Any] | None = t
            elif _covers(tn, un):
                met = u
            else:
                met = _meet_one(tn, un)
            if met is None:
                continue
            norm = _norm(met)
            assert norm is not None
            found.append((met, norm))
    kept: list[tuple[Mapping[str, Any], tuple[str, str, str, str, int | None]]] = []
    for index, (met, norm) in enumerate(found):
        if any(
            _covers(other, norm) and (other != norm or j < index)
            for j, (_, other) in enumerate(found)
            if j != index
        ):
            continue  # another covers it (of equals, the first is kept)
        kept.append((met, norm))
    return tuple(met for met, _ in kept[:MAX_TOLERATIONS])
