"""How a placeholder is moved off a node that cannot take its run's next pod. Pure.

The StatefulSet itself carries the state, so a restarted (or newly elected) reconciler
knows it: the annotation ``coschedule.dev/relocations`` lists the topology domains the
placeholder left in this run and the node it was sent to. Its pod template gets

- a required node affinity ``<topology key> NotIn [<left domains>]``: never back to a
  domain it left (the run's data or pods could not follow it there anyway);
- a preferred node affinity (weight 100) to the chosen node, where the stuck pod fits.

The StatefulSet uses ``updateStrategy: OnDelete``: the new template takes effect when the
reconciler deletes the placeholder pod, which the StatefulSet controller then recreates.
Teardown deletes the StatefulSet, and with it this state: a new run starts unsteered.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from coschedule.k8s.constants import HOSTNAME, PREFERRED, REQUIRED
from coschedule.k8s.node_constraints import and_expressions
from coschedule.k8s.nodeaffinity import required_terms
from coschedule.reconcile.model import Obj

ANNOTATION_RELOCATIONS = "coschedule.dev/relocations"


@dataclass(frozen=True, slots=True)
class Relocations:
    topology_key: str
    left: tuple[str, ...]  # domains (values of the topology key) the placeholder left
    target: str  # the hostname label of the node it was sent to
    at: float  # when (epoch seconds): the scheduler gets a grace period after a move

    def encode(self) -> str:
        return orjson.dumps(
            {
                "topologyKey": self.topology_key,
                "left": list(self.left),
                "target": self.target,
                "at": round(self.at, 3),
            },
            option=orjson.OPT_SORT_KEYS,
        ).decode()

    def moved(self, topology_key: str, domain: str, target: str, now: float) -> Relocations:
        return Relocations(topology_key, (*self.left, domain), target, now)


def parse(annotations: Mapping[str, str]) -> Relocations | None:
    """The state on a StatefulSet; None when it never moved (or the annotation is junk:
    a hand-edited annotation must not wedge the reconciler)."""
    text = annotations.get(ANNOTATION_RELOCATIONS)
    if not text:
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    key, left, target, at = (
        doc.get("topologyKey"),
        doc.get("left"),
        doc.get("target"),
        doc.get("at"),
    )
    if not isinstance(key, str) or not isinstance(left, list) or not isinstance(target, str):
        return None
    return Relocations(
        key,
        tuple(str(v) for v in left),
        target,
        float(at) if isinstance(at, int | float) else 0.0,
    )


def first(topology_key: str, domain: str, target: str, now: float) -> Relocations:
    return Relocations(topology_key, (domain,), target, now)


def steer(template: Obj, annotations: Mapping[str, str]) -> Obj:
    """The placeholder's pod template with the node affinity its relocations ask for."""
    state = parse(annotations)
    if state is None or not state.left:
        return template
    steered = copy.deepcopy(template)
    affinity = steered.setdefault("spec", {}).setdefault("affinity", {})
    # ANDed into the run's own required terms (where its pods may go), never instead.
    never_back = {"key": state.topology_key, "operator": "NotIn", "values": sorted(set(state.left))}
    own = required_terms(affinity)
    terms = and_expressions(own, [never_back]) or ()
    node_affinity: Obj = {REQUIRED: {"nodeSelectorTerms": [dict(t) for t in terms]}}
    if state.target:
        node_affinity[PREFERRED] = [
            {
                "weight": 100,
                "preference": {
                    "matchExpressions": [
                        {"key": HOSTNAME, "operator": "In", "values": [state.target]}
                    ]
                },
            }
        ]
    affinity["nodeAffinity"] = node_affinity
    return steered
