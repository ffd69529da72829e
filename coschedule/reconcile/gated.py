"""Pods waiting behind the placeholder's scheduling gate, from the reconciler's pod cache:
how many, and how long the oldest has waited (``coschedule_gated_pods``,
``coschedule_gated_pod_oldest_seconds``). Pure: observed pods and a clock in, numbers out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from coschedule.k8s.constants import TERMINAL_PHASES
from coschedule.k8s.timefmt import parse_time
from coschedule.placement.node_pin import gate_index


def gated_pods(pods: Iterable[Mapping[str, Any]], now: float) -> tuple[int, float]:
    """(marked pods still behind ``coschedule.dev/placeholder``, age in seconds of the
    oldest of them: 0 when there is none). A pod being deleted or finished is not waiting."""
    count = 0
    oldest: float | None = None
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        if meta.get("deletionTimestamp") or gate_index(spec) is None:
            continue
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        count += 1
        created = parse_time(meta.get("creationTimestamp"))
        if created is not None and (oldest is None or created < oldest):
            oldest = created
    return count, max(0.0, now - oldest) if oldest is not None else 0.0
