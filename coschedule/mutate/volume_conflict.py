"""Admission pre-flight, rule ``claims-conflict`` (modes ``pipelineruns`` and
``isolate-pipelinerun``). Pure.

A run whose bound claims live on volumes that cannot share one topology domain, or whose
pod's nodeSelector / required node affinity excludes the only place its bound volumes can
be used, could never run: co-location would leave it pending forever. Refuse it at once,
naming each claim and where its volume is.

- One pod runs on one node: its own bound claims must allow a common node (checked on the
  hostname and the zone labels, whatever the topology key).
- The run shares one domain of the topology key: all its bound claims (the pod's and the
  run's known claims) must allow a common value of that key (with the hostname key, a
  common zone too: one node is in one zone).
- The pod's own node constraints must allow that common place, for every key a volume pins.

Only what the volumes pin on those keys is compared: a volume pinned by other labels, or
a node-local volume checked against a zone, needs node labels the webhook does not keep;
those are left to the scheduler (and the reconciler's stuck-run explanation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coschedule.k8s.constants import HOSTNAME, ZONE, ZONE_KEYS
from coschedule.k8s.nodeaffinity import expression_matches
from coschedule.k8s.volumes import VolumeTopology, common

RULE = "claims-conflict"


@dataclass(frozen=True, slots=True)
class BoundClaim:
    claim: str
    volume: VolumeTopology

    def where(self) -> str:
        return f"claim {self.claim} (volume {self.volume.name}) on {self.volume.describe()}"


def _keys(topology_key: str) -> tuple[str, ...]:
    keys = [topology_key]
    if topology_key == HOSTNAME:
        keys += ZONE_KEYS
    return tuple(dict.fromkeys(keys))


def _split(claims: Sequence[BoundClaim], key: str) -> str | None:
    """A sentence naming the claims when those that pin ``key`` share no value of it."""
    pinning = [(c, pin) for c in claims if (pin := c.volume.pinned(key)) is not None]
    if len(pinning) < 2 or common([pin for _, pin in pinning]):
        return None
    return ", ".join(c.where() for c, _ in pinning)


def _term_allows(term: Mapping[str, Any], key: str, allowed: frozenset[str]) -> bool:
    """Could this node-affinity term hold on a node whose ``key`` is one of ``allowed``?"""
    expressions = [
        e for e in term.get("matchExpressions") or () if isinstance(e, dict) and e.get("key") == key
    ]
    return any(all(expression_matches(e, value) for e in expressions) for value in allowed)


def _excluded_by_pod(
    claims: Sequence[BoundClaim],
    key: str,
    node_selector: Mapping[str, str],
    terms: Sequence[Mapping[str, Any]] | None,
) -> str | None:
    pinning = [(c, pin) for c in claims if (pin := c.volume.pinned(key)) is not None]
    if not pinning:
        return None
    allowed = common([pin for _, pin in pinning])
    if not allowed:
        return None  # already a split; reported as such
    names = ", ".join(c.where() for c, _ in pinning)
    wanted = node_selector.get(key)
    if wanted is not None and wanted not in allowed:
        return (
            f"the pod's nodeSelector {key}={wanted} excludes {key} {', '.join(sorted(allowed))}, "
            f"the only place its bound volumes can be used: {names}"
        )
    if terms is not None and not any(_term_allows(t, key, allowed) for t in terms):
        return (
            f"the pod's required node affinity excludes {key} {', '.join(sorted(allowed))}, "
            f"the only place its bound volumes can be used: {names}"
        )
    return None


def check(
    pod_claims: Sequence[BoundClaim],
    run_claims: Sequence[BoundClaim],
    topology_key: str,
    node_selector: Mapping[str, str],
    terms: Sequence[Mapping[str, Any]] | None,
) -> str | None:
    """The denial message (without the rule prefix), or None when the run can be placed.

    ``pod_claims`` are the pod's own bound claims; ``run_claims`` the run's other bound
    claims the webhook knows of."""
    for key in (HOSTNAME, *ZONE_KEYS):
        split = _split(pod_claims, key)
        if split is not None:
            return (
                f"the pod mounts claims whose volumes cannot be used on one node ({key} "
                f"differs): {split}. It could never be scheduled. Fix: mount volumes that "
                "live together (copy the data onto one volume, or bind the claims in one "
                "place), or split the work between pods that each mount one of them."
            )
    everything = list({c.claim: c for c in [*pod_claims, *run_claims]}.values())
    for key in _keys(topology_key):
        split = _split(everything, key)
        if split is not None:
            return (
                f"the run's bound claims live on volumes in different domains of the topology "
                f"key {key}, but coschedule keeps a run in one: {split}. The run could never "
                "be scheduled. Fix: bind the run's claims to volumes in one place (or copy "
                "the data), use volumeClaimTemplates so the run's volumes are provisioned "
                "together, or, for zonal volumes in one zone, set topology-key to "
                f"{ZONE}."
            )
    for key in (*_keys(topology_key), HOSTNAME):
        excluded = _excluded_by_pod(everything, key, node_selector, terms)
        if excluded is not None:
            return (
                f"{excluded}. The pod could never be scheduled. Fix: change the pod's "
                "nodeSelector / node affinity to allow that place, or bind the claims there."
            )
    return None
