"""Does a pod fit on a node? The scheduler's NodeResourcesFit arithmetic, pure.

A pod's request is, per resource, the larger of its containers' sum (plus restartable init
containers: sidecars) and its largest init container, plus ``spec.overhead``; it always
takes one of the node's ``pods``. A node's free amount is its allocatable minus what the
non-terminated pods bound to it request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

PODS = "pods"
_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")

Resources = Mapping[str, Decimal]


def quantity(text: Any) -> Decimal | None:
    """A Kubernetes quantity ("500m", "2Gi", "1e3", 4) as a number; None if malformed."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(str(text).strip())
    if match is None or match.group(2) not in _SUFFIXES:
        return None
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
    except InvalidOperation:
        return None


def resources(values: Any) -> dict[str, Decimal]:
    """A ``{name: quantity}`` map (requests, allocatable) as numbers; bad entries dropped."""
    result: dict[str, Decimal] = {}
    if isinstance(values, dict):
        for name, text in values.items():
            amount = quantity(text)
            if amount is not None:
                result[str(name)] = amount
    return result


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


def show(name: str, amount: Decimal) -> str:
    """A quantity as a person reads it: cpu in cores, memory in Mi/Gi, counts as counts."""
    if name in ("memory", "ephemeral-storage") or name.startswith("hugepages-"):
        for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if amount >= size:
                return f"{round(amount / size, 2).normalize():f}{unit}"
        return f"{amount.normalize():f}"
    return f"{round(amount, 3).normalize():f}"
