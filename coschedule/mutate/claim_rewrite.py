"""Volume co-location (TEP-0135): which claims of a run the placeholder provisions.

In ``pipelineruns`` and ``isolate-pipelinerun`` modes, a claim that the engine made for
this run from a volume claim template, and that no pod can have written to yet (unbound),
becomes a ``volumeClaimTemplates`` entry of the placeholder StatefulSet; every pod of the
run mounts the StatefulSet's claim ``<template>-<placeholder>-0`` instead, so all volumes
of the run are provisioned together, where the placeholder runs.

The decision for a run is taken once and read by both sides: while the StatefulSet does
not exist, every pod carries the whole run's template set (computed from the same claim
cache, by the same rule) in an annotation, and the reconciler builds the StatefulSet from
it; once the StatefulSet exists, its ``volumeClaimTemplates`` (immutable) are the decision.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from coschedule import marks
from coschedule.engines import CLAIM_OWNER_KINDS
from coschedule.marks import (
    ANNOTATION_CLAIM_TEMPLATES,
    LABEL_GROUP,
    LABEL_MANAGED_BY,
    LABEL_PLACEHOLDER,
    LABEL_SKIP,
    MANAGED_BY,
    ClaimTemplate,
    statefulset_templates,
)

# Owner kinds whose name is a run's name: the objects engines make claims for.
RUN_OWNER_KINDS = CLAIM_OWNER_KINDS
SHARED_ACCESS_MODES = frozenset({"ReadWriteMany", "ReadOnlyMany"})
TEMPLATE_NAME_MAX = 63
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class ClaimInfo:
    """What the decisions need of a PersistentVolumeClaim (the cache keeps only this)."""

    name: str
    owners: tuple[tuple[str, str], ...] = ()  # (kind, name) of each ownerReference
    group: str | None = None  # its coschedule.dev/group label
    access_modes: tuple[str, ...] = ()
    bound: bool = False
    skip: bool = False  # labelled coschedule.dev/skip=true
    ours: bool = False  # made by a placeholder's volumeClaimTemplates
    template_spec: Mapping[str, Any] | None = None  # what a volumeClaimTemplate copies
    volume: str = ""  # spec.volumeName once bound: where its data can be used

    @property
    def shared(self) -> bool:
        return bool(SHARED_ACCESS_MODES.intersection(self.access_modes))

    def belongs_to(self, run: str) -> bool:
        return self.group == run or any(
            kind in RUN_OWNER_KINDS and name == run for kind, name in self.owners
        )


def claim_info(pvc: Mapping[str, Any]) -> ClaimInfo:
    """From a PVC object as the API returns it (tolerant: a cache must not crash)."""
    meta = pvc.get("metadata") or {}
    spec = pvc.get("spec") or {}
    status = pvc.get("status") or {}
    labels = meta.get("labels") or {}
    owners = tuple(
        (str(ref.get("kind", "")), str(ref.get("name", "")))
        for ref in meta.get("ownerReferences") or ()
        if isinstance(ref, dict)
    )
    modes = tuple(str(m) for m in spec.get("accessModes") or ())
    template: dict[str, Any] = {"accessModes": list(modes)}
    for key in ("storageClassName", "volumeMode", "resources", "volumeAttributesClassName"):
        if spec.get(key) is not None:
            template[key] = spec[key]
    return ClaimInfo(
        name=str(meta.get("name", "")),
        owners=owners,
        group=labels.get(LABEL_GROUP),
        access_modes=modes,
        bound=bool(spec.get("volumeName")) or status.get("phase") == "Bound",
        skip=labels.get(LABEL_SKIP) == "true",
        ours=labels.get(LABEL_MANAGED_BY) == MANAGED_BY,
        template_spec=template,
        volume=str(spec.get("volumeName") or ""),
    )


class ClaimView(Protocol):
    """The webhook's watch-fed view of claims and placeholder StatefulSets."""

    @property
    def synced(self) -> bool: ...

    def get(self, namespace: str, name: str) -> ClaimInfo | None: ...

    def run_claims(self, namespace: str, run: str) -> Sequence[ClaimInfo]: ...

    def placeholder_templates(self, namespace: str, placeholder: str) -> Mapping[str, str] | None:
        """{template name: original claim} of an existing placeholder; None if none yet."""
        ...

    def pod_decision(self, namespace: str, placeholder: str) -> tuple[ClaimTemplate, ...] | None:
        """The template set the earliest admitted pod of this placeholder carries; None if
        no marked pod with one is known."""
        ...


def template_name(claim: str) -> str:
    """A volumeClaimTemplate name (a DNS label of at most 63) for an original claim."""
    if len(claim) <= TEMPLATE_NAME_MAX and _DNS_LABEL.match(claim):
        return claim
    return "pvc-" + hashlib.sha256(claim.encode("utf-8")).hexdigest()[:16]


def groupable(claim: ClaimInfo | None, group_shared: bool = False) -> bool:
    """Skipped and shared (RWX/ROX) claims are neither grouped nor rewritten."""
    if claim is None:
        return True  # unknown: offline there is no cache; grouping is the safe default
    return not claim.skip and (group_shared or not claim.shared)


def rewritable(claim: ClaimInfo, run: str, group_shared: bool = False) -> bool:
    return (
        groupable(claim, group_shared)
        and not claim.bound
        and not claim.ours
        and claim.belongs_to(run)
    )


def run_templates(
    claims: Sequence[ClaimInfo], run: str, group_shared: bool = False
) -> tuple[ClaimTemplate, ...]:
    """The run's template set, by the one rule both sides use; sorted, so stable."""
    found = {
        template_name(c.name): ClaimTemplate(template_name(c.name), c.name, c.template_spec or {})
        for c in claims
        if rewritable(c, run, group_shared)
    }
    return tuple(found[name] for name in sorted(found))


@dataclass(frozen=True, slots=True, order=True)
class MarkedPodDecision:
    """A marked pod's claim decision; ordered so that ``min`` is the earliest admitted."""

    created: str  # creationTimestamp: RFC 3339 sorts as text
    name: str
    placeholder: str = field(compare=False)
    templates: tuple[ClaimTemplate, ...] = field(compare=False)


def pod_decision(pod: Mapping[str, Any]) -> MarkedPodDecision | None:
    """The claim decision a marked pod carries, if any."""
    meta = pod.get("metadata") or {}
    placeholder = (meta.get("labels") or {}).get(LABEL_PLACEHOLDER)
    text = (meta.get("annotations") or {}).get(ANNOTATION_CLAIM_TEMPLATES)
    if not isinstance(placeholder, str) or not isinstance(text, str):
        return None
    templates = marks.parse_claim_templates(text)
    if isinstance(templates, str):
        return None
    created = str(meta.get("creationTimestamp") or "")
    return MarkedPodDecision(created, str(meta.get("name", "")), placeholder, templates)


@dataclass(frozen=True, slots=True)
class StaticClaims:
    """A ClaimView over objects given up front (``explain -c claims.yaml``)."""

    claims: Mapping[tuple[str, str], ClaimInfo]
    templates: Mapping[tuple[str, str], Mapping[str, str]]
    decisions: Mapping[tuple[str, str], tuple[ClaimTemplate, ...]]

    @classmethod
    def from_objects(cls, objects: Sequence[Mapping[str, Any]], namespace: str) -> StaticClaims:
        claims: dict[tuple[str, str], ClaimInfo] = {}
        templates: dict[tuple[str, str], Mapping[str, str]] = {}
        pods: dict[tuple[str, str], list[MarkedPodDecision]] = {}
        for obj in objects:
            meta = obj.get("metadata") or {}
            key = (str(meta.get("namespace") or namespace), str(meta.get("name", "")))
            if obj.get("kind") == "PersistentVolumeClaim":
                claims[key] = claim_info(obj)
            elif obj.get("kind") == "StatefulSet":
                templates[key] = statefulset_templates(obj)
            elif obj.get("kind") == "Pod" and (found := pod_decision(obj)) is not None:
                pods.setdefault((key[0], found.placeholder), []).append(found)
        decisions = {key: min(found).templates for key, found in pods.items()}
        return cls(claims, templates, decisions)

    @property
    def synced(self) -> bool:
        return True

    def get(self, namespace: str, name: str) -> ClaimInfo | None:
        return self.claims.get((namespace, name))

    def run_claims(self, namespace: str, run: str) -> Sequence[ClaimInfo]:
        return [
            info
            for (ns, name), info in sorted(self.claims.items())
            if ns == namespace and info.belongs_to(run)
        ]

    def placeholder_templates(self, namespace: str, placeholder: str) -> Mapping[str, str] | None:
        return self.templates.get((namespace, placeholder))

    def pod_decision(self, namespace: str, placeholder: str) -> tuple[ClaimTemplate, ...] | None:
        return self.decisions.get((namespace, placeholder))
