"""A Node as scheduling rules read it (name, labels, cordon, taints, allocatable). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from coschedule.k8s.quantity import resources


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, Decimal] = field(default_factory=dict)

    def domain(self, topology_key: str) -> str | None:
        return self.labels.get(topology_key)


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A node's ``spec.taints`` (tolerant of odd shapes)."""
    taints = spec.get("taints")
    return tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in (taints if isinstance(taints, list) else ())
        if isinstance(t, dict)
    )


def parse_node(obj: Mapping[str, Any]) -> Node:
    """From a Node as the API returns it, or a cache's slim copy of one."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    return Node(
        name=str(meta.get("name") or ""),
        unschedulable=bool(spec.get("unschedulable")),
        taints=parse_taints(spec),
        labels={str(k): str(v) for k, v in _dict(meta.get("labels")).items()},
        allocatable=resources(_dict(obj.get("status")).get("allocatable")),
    )
