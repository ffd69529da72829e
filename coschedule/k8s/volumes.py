"""Where a PersistentVolume can be used: its required node affinity, as plain data. Pure.

A node-local volume (local PV, hostPath, a CSI driver's node topology) is pinned by
``kubernetes.io/hostname``; a zonal disk by ``topology.kubernetes.io/zone``. The older
zone labels on the PV itself (read by the scheduler's VolumeZone plugin) count too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coschedule.k8s.constants import HOSTNAME, REGION_KEYS, ZONE_KEYS
from coschedule.k8s.nodeaffinity import NAME_FIELD, terms_match


@dataclass(frozen=True, slots=True)
class VolumeTopology:
    """A PV's name and the node selector terms (ORed) that say where it can be used;
    no terms: anywhere."""

    name: str
    terms: tuple[Mapping[str, Any], ...] = ()

    def allows(self, labels: Mapping[str, str], node: str) -> bool:
        return not self.terms or terms_match(self.terms, labels, node)

    def pinned(self, key: str) -> frozenset[str] | None:
        """The values of ``key`` the volume is confined to, or None when some term leaves
        ``key`` free. For the hostname, ``matchFields`` on ``metadata.name`` counts too."""
        if not self.terms:
            return None
        found: set[str] = set()
        for term in self.terms:
            values = _term_values(term, key)
            if values is None:
                return None
            found |= values
        return frozenset(found)

    def describe(self) -> str:
        """Where it can be used, as a person says it: "node n1", "zone z1", or the terms."""
        hosts = self.pinned(HOSTNAME)
        if hosts is not None:
            return f"node {_names(hosts)}" if len(hosts) == 1 else f"nodes {_names(hosts)}"
        for key in ZONE_KEYS:
            zones = self.pinned(key)
            if zones is not None:
                return f"zone {_names(zones)}" if len(zones) == 1 else f"zones {_names(zones)}"
        if not self.terms:
            return "any node"
        return "nodes matching " + " or ".join(_describe_term(t) for t in self.terms)


def _names(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


def _term_values(term: Mapping[str, Any], key: str) -> set[str] | None:
    """The values an ``In`` requirement of this term allows for ``key`` (intersected if
    several); None if the term has none on ``key``."""
    allowed: set[str] | None = None
    requirements = [
        *[
            (e, str(e.get("key")))
            for e in term.get("matchExpressions") or ()
            if isinstance(e, dict)
        ],
        *[
            (f, HOSTNAME if f.get("key") == NAME_FIELD else "")
            for f in term.get("matchFields") or ()
            if isinstance(f, dict)
        ],
    ]
    for requirement, requirement_key in requirements:
        if requirement_key != key or requirement.get("operator") != "In":
            continue
        values = {str(v) for v in requirement.get("values") or ()}
        allowed = values if allowed is None else allowed & values
    return allowed


def _describe_term(term: Mapping[str, Any]) -> str:
    parts = []
    for expression in term.get("matchExpressions") or ():
        if isinstance(expression, dict):
            values = ",".join(str(v) for v in expression.get("values") or ())
            parts.append(f"{expression.get('key')} {expression.get('operator')} [{values}]")
    return " and ".join(parts) or "(empty term)"


def _label_terms(labels: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The legacy zone/region labels of a PV as requirements (``a__b``: either)."""
    expressions = []
    for key in (*ZONE_KEYS, *REGION_KEYS):
        value = labels.get(key)
        if isinstance(value, str) and value:
            expressions.append({"key": key, "operator": "In", "values": value.split("__")})
    return expressions


def volume_topology(pv: Mapping[str, Any]) -> VolumeTopology:
    """From a PersistentVolume as the API returns it (tolerant of odd shapes)."""
    meta = pv.get("metadata") or {}
    spec = pv.get("spec") or {}
    required = ((spec.get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms")
    terms: list[dict[str, Any]] = [dict(t) for t in required or () if isinstance(t, dict)]
    extra = _label_terms(meta.get("labels") or {})
    if extra:
        if terms:
            terms = [
                {**t, "matchExpressions": [*(t.get("matchExpressions") or ()), *extra]}
                for t in terms
            ]
        else:
            terms = [{"matchExpressions": extra}]
    return VolumeTopology(name=str(meta.get("name") or ""), terms=tuple(terms))


def common(pins: Sequence[frozenset[str]]) -> frozenset[str]:
    """The values every pin allows."""
    result = pins[0]
    for pin in pins[1:]:
        result = result & pin
    return result
