"""Does a pod fit on a node? The scheduler's NodeResourcesFit arithmetic, pure.

A pod's request is, per resource, the larger of its containers' sum (plus restartable init
containers: sidecars) and its largest init container, plus ``spec.overhead``; it always
takes one of the node's ``pods``. A node's free amount is its allocatable minus what the
non-terminated pods bound to it request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from coschedule.k8s.quantity import resources

PODS = "pods"


def _add(into: dict[str, Decimal], more: Mapping[str, Decimal]) -> None:
    for name, amount in more.items():
        into[name] = into.get(name, Decimal(0)) + amount


def _requests(container: Any) -> dict[str, Decimal]:
    if not isinstance(container, dict):
        return {}
    return resources((container.get("resources") or {}).get("requests"))


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the scheduler reserves for the pod on a node (``pods`` included)."""
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or ():
        _add(total, _requests(container))
    init_peak: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    for container in spec.get("initContainers") or ():
        wanted = _requests(container)
        if isinstance(container, dict) and container.get("restartPolicy") == "Always":
            _add(sidecars, wanted)  # a sidecar runs alongside the app containers
            _add(total, wanted)
            continue
        for name, amount in wanted.items():
            # An init container runs alongside the sidecars started before it.
            peak = amount + sidecars.get(name, Decimal(0))
            init_peak[name] = max(init_peak.get(name, Decimal(0)), peak)
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, Decimal(0)), amount)
    _add(total, resources(spec.get("overhead")))
    total[PODS] = Decimal(1)
    return {name: amount for name, amount in total.items() if amount}


def used(pods: Iterable[Mapping[str, Decimal]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for requests in pods:
        _add(total, requests)
    return total


def shortfalls(
    requests: Mapping[str, Decimal],
    allocatable: Mapping[str, Decimal],
    in_use: Mapping[str, Decimal],
) -> list[tuple[str, Decimal, Decimal]]:
    """(resource, requested, free) for every resource the node cannot give the pod."""
    short = []
    for name, amount in sorted(requests.items()):
        free = allocatable.get(name, Decimal(0)) - in_use.get(name, Decimal(0))
        if amount > free:
            short.append((name, amount, max(free, Decimal(0))))
    return short
