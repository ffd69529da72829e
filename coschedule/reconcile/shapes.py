"""Cache shapes: informer transforms that keep only what decisions read, and their parsers.

Transforms run on every listed or watched object, so the caches hold small plain dicts
(20,000 pods must fit in the RSS budget). Parsers turn those dicts into the frozen model;
a pod with malformed marks parses to ``BadMark`` instead of raising.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule import marks
from coschedule.engines import pod_recreated_by_owner
from coschedule.k8s.constants import REQUIRED, TERMINAL_PHASES
from coschedule.k8s.node_constraints import spread_keys, strip_pin, with_spread
from coschedule.k8s.nodeaffinity import required_terms
from coschedule.k8s.nodes import ready_condition
from coschedule.k8s.timefmt import parse_time
from coschedule.marks import (
    ALL_MARK_ANNOTATIONS,
    ANNOTATION_PINNED_NODE,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_PLACEHOLDER,
    BadMark,
    statefulset_templates,
)
from coschedule.placement import node_pin
from coschedule.reconcile.model import (
    MarkedPod,
    Obj,
    ObservedSet,
    OwnerRef,
    PlaceholderPod,
)

_PLACEHOLDER_LABELS = frozenset({LABEL_COMPONENT, LABEL_INSTANCE, LABEL_MANAGED_BY})
_KEPT_ANNOTATIONS = (*ALL_MARK_ANNOTATIONS, ANNOTATION_PINNED_NODE)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _controller_ref(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    for ref in _list(meta.get("ownerReferences")):
        if isinstance(ref, dict) and ref.get("controller") is True:
            return {k: ref.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
    return None


def _finished_at(status: Mapping[str, Any]) -> str | None:
    latest: str | None = None
    for cs in _list(status.get("containerStatuses")):
        ended = _dict(_dict(_dict(cs).get("state")).get("terminated")).get("finishedAt")
        if isinstance(ended, str) and (latest is None or ended > latest):
            latest = ended
    return latest


def other_assistants(spec: Mapping[str, Any], placeholder: str) -> list[str]:
    """The placeholders other than ``placeholder`` a pod's required pod affinity pins it to:
    Tekton's own Affinity Assistant's term has the shape of ours (component and instance
    labels), so a marked pod that has one is pinned to both."""
    pod_affinity = _dict(_dict(spec.get("affinity")).get("podAffinity"))
    found = (marks.term_placeholder(term) for term in _list(pod_affinity.get(REQUIRED)))
    return sorted({instance for instance in found if instance and instance != placeholder})


def node_terms(spec: Mapping[str, Any], pinned: str | None) -> tuple[Mapping[str, Any], ...] | None:
    """The pod's own required node-affinity terms (our pin taken out) with what its spread
    constraints require of a node: what its placeholder must carry too."""
    terms = strip_pin(required_terms(spec.get("affinity")), pinned)
    return with_spread(terms, spread_keys(spec))


def slim_marked_pod(obj: Obj) -> Obj:
    """Informer transform for marked pods: metadata we read, scheduling inputs, phase."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    labels = _dict(meta.get("labels"))
    annotations = _dict(meta.get("annotations"))
    slim_meta: Obj = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
        "creationTimestamp": meta.get("creationTimestamp"),
        "labels": {LABEL_PLACEHOLDER: labels.get(LABEL_PLACEHOLDER)},
        "annotations": {k: annotations[k] for k in _KEPT_ANNOTATIONS if k in annotations},
    }
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    ref = _controller_ref(meta)
    if ref is not None:
        slim_meta["ownerReferences"] = [ref]
    slim_spec: Obj = {"nodeName": spec.get("nodeName") or ""}
    if spec.get("nodeSelector"):
        slim_spec["nodeSelector"] = spec["nodeSelector"]
    if spec.get("tolerations"):
        slim_spec["tolerations"] = spec["tolerations"]
    if spec.get("schedulerName"):
        slim_spec["schedulerName"] = spec["schedulerName"]
    if spec.get("schedulingGates"):
        # Kept whole (the release patch tests our gate at its index); and while our gate
        # holds the pod, its affinity, which the release patch pins into.
        slim_spec["schedulingGates"] = spec["schedulingGates"]
        if spec.get("affinity") and node_pin.gate_index(spec) is not None:
            slim_spec["affinity"] = spec["affinity"]
    terms = node_terms(spec, node_pin.pinned_node(meta))
    if terms is not None:
        slim_spec["nodeTerms"] = [dict(t) for t in terms]
    others = other_assistants(spec, str(labels.get(LABEL_PLACEHOLDER) or ""))
    if others:
        slim_spec["otherAssistants"] = others
    slim_status: Obj = {"phase": status.get("phase") or ""}
    finished = _finished_at(status)
    if finished:
        slim_status["finishedAt"] = finished
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


def slim_placeholder_pod(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    slim_meta: Obj = {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
        "labels": {k: v for k, v in _dict(meta.get("labels")).items() if k in _PLACEHOLDER_LABELS},
    }
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    slim_spec: Obj = {"nodeName": spec.get("nodeName") or ""}
    if spec.get("tolerations"):
        slim_spec["tolerations"] = spec["tolerations"]
    return {"metadata": slim_meta, "spec": slim_spec}


def slim_node(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    slim_spec: Obj = {}
    if spec.get("unschedulable"):
        slim_spec["unschedulable"] = True
    taints = [
        {k: t.get(k) for k in ("key", "value", "effect") if t.get(k) is not None}
        for t in _list(spec.get("taints"))
        if isinstance(t, dict)
    ]
    if taints:
        slim_spec["taints"] = taints
    slim: Obj = {
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": _dict(meta.get("labels")),
        },
        "spec": slim_spec,
    }
    ready = ready_condition(_dict(obj.get("status")))
    if ready:  # whether its kubelet reports (a dead node's placeholder pod is force-deleted)
        kept = {k: ready[k] for k in ("type", "status", "lastTransitionTime") if k in ready}
        slim["status"] = {"conditions": [kept]}
    return slim


def slim_statefulset(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    slim_meta: Obj = {
        k: meta.get(k)
        for k in ("name", "namespace", "uid", "resourceVersion", "labels", "annotations")
    }
    if meta.get("ownerReferences"):
        slim_meta["ownerReferences"] = meta["ownerReferences"]
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    strategy = _dict(spec.get("updateStrategy")).get("type")
    slim_spec: Obj = {"replicas": spec.get("replicas"), "strategy": strategy}
    templates = statefulset_templates(obj)
    if templates:
        slim_spec["templates"] = templates
    return {"metadata": slim_meta, "spec": slim_spec}


def parse_marked(obj: Mapping[str, Any]) -> MarkedPod | BadMark:
    """A slim marked pod -> ``MarkedPod``; malformed marks -> ``BadMark`` with the reason."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    found = marks.parse(meta)
    if isinstance(found, BadMark):
        return found
    ref = _controller_ref(meta)
    owner = None
    if ref is not None and all(
        isinstance(ref.get(k), str) and ref[k] for k in ("apiVersion", "kind", "name", "uid")
    ):
        owner = OwnerRef(ref["apiVersion"], ref["kind"], ref["name"], ref["uid"])
    selector = _dict(spec.get("nodeSelector"))
    gated = None
    if node_pin.gate_index(spec) is not None:
        gated = {"metadata": {"annotations": _dict(meta.get("annotations"))}, "spec": spec}
    return MarkedPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        marks=found,
        node_selector={str(k): str(v) for k, v in selector.items()},
        tolerations=tuple(t for t in _list(spec.get("tolerations")) if isinstance(t, dict)),
        owner=owner,
        live=status.get("phase") not in TERMINAL_PHASES and not meta.get("deletionTimestamp"),
        finished_at=parse_time(status.get("finishedAt")),
        scheduler_name=str(spec.get("schedulerName") or ""),
        node_name=str(spec.get("nodeName") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        pinned_node=node_pin.pinned_node(meta),
        recreated=pod_recreated_by_owner(meta.get("ownerReferences")),
        gated=gated,
        other_assistants=tuple(str(a) for a in _list(spec.get("otherAssistants"))),
        node_terms=(
            tuple(t for t in terms if isinstance(t, dict))
            if isinstance(terms := spec.get("nodeTerms"), list)
            else None
        ),
    )


def parse_placeholder_pod(obj: Mapping[str, Any]) -> PlaceholderPod:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    return PlaceholderPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        node_name=str(spec.get("nodeName") or ""),
        tolerations=tuple(t for t in _list(spec.get("tolerations")) if isinstance(t, dict)),
        deleting=bool(meta.get("deletionTimestamp")),
        uid=str(meta.get("uid") or ""),
        deletion_due=parse_time(meta.get("deletionTimestamp")),
    )


def placeholder_instance(obj: Mapping[str, Any]) -> str:
    """The placeholder a pod belongs to if it is a placeholder pod we manage, else ""."""
    return marks.managed_placeholder(_dict(_dict(obj.get("metadata")).get("labels")))


def marked_placeholder(obj: Mapping[str, Any]) -> str:
    """The placeholder label of a marked pod ("" if absent)."""
    return marks.placeholder_of(_dict(obj.get("metadata")))


def parse_statefulset(obj: Mapping[str, Any]) -> ObservedSet:
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    replicas = spec.get("replicas")
    return ObservedSet(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        replicas=replicas if isinstance(replicas, int) else None,
        update_strategy=str(spec.get("strategy") or "RollingUpdate"),
        labels={str(k): str(v) for k, v in _dict(meta.get("labels")).items()},
        annotations={str(k): str(v) for k, v in _dict(meta.get("annotations")).items()},
        owner_references=tuple(
            r for r in _list(meta.get("ownerReferences")) if isinstance(r, dict)
        ),
        deleting=bool(meta.get("deletionTimestamp")),
        templates={str(k): str(v) for k, v in _dict(spec.get("templates")).items()},
    )
